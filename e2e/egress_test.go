package e2e

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The world a sandbox may reach in these tests: servers on loopback
// under names SANDBOX_EGRESS_HOSTS maps, never a mock of the proxy.
type world struct {
	files, secure, pypi, npm int // ports
	index                    *packageIndex
}

// loopback serves h on a port of the kernel's choosing.
func loopback(t *testing.T, h http.Handler) int {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	u, _ := url.Parse(srv.URL)
	port, _ := strconv.Atoi(u.Port())
	return port
}

func newWorld(t *testing.T) *world {
	t.Helper()
	w := &world{index: newPackageIndex(t)}
	files := http.NewServeMux()
	files.HandleFunc("/hello", func(rw http.ResponseWriter, r *http.Request) { fmt.Fprintf(rw, "hello from %s", r.Host) })
	files.HandleFunc("/big", func(rw http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(r.URL.Query().Get("n"))
		rw.Header().Set("Content-Length", strconv.Itoa(n))
		chunk := bytes.Repeat([]byte("b"), 64<<10)
		for n > 0 {
			k := min(n, len(chunk))
			if _, err := rw.Write(chunk[:k]); err != nil {
				return
			}
			n -= k
		}
	})
	w.files = loopback(t, files)
	tlsSrv := httptest.NewTLSServer(files)
	t.Cleanup(tlsSrv.Close)
	u, _ := url.Parse(tlsSrv.URL)
	w.secure, _ = strconv.Atoi(u.Port())
	w.pypi = loopback(t, w.index.pypi())
	w.npm = loopback(t, w.index.npmRegistry(func() int { return w.npm }))
	return w
}

func (w *world) env() []string {
	return []string{
		"SANDBOX_EGRESS_ALLOW=files.test,secure.test,pypi.test,npm.test,other.test,localhost",
		fmt.Sprintf("SANDBOX_EGRESS_HOSTS=files.test=127.0.0.1:%d,secure.test=127.0.0.1:%d,pypi.test=127.0.0.1:%d,npm.test=127.0.0.1:%d,other.test=127.0.0.1:%[1]d",
			w.files, w.secure, w.pypi, w.npm),
		"SANDBOX_EGRESS_MAX_BYTES=16m",
		fmt.Sprintf("SANDBOX_PIP_INDEX_URL=http://pypi.test:%d/simple", w.pypi),
		fmt.Sprintf("SANDBOX_NPM_REGISTRY=http://npm.test:%d/", w.npm),
		"SANDBOX_QUOTA_BYTES=8388608",
		"AUDIT_KEY=" + auditKey,
	}
}

// egressResult is a RunResult with what this file looks at.
type egressResult struct {
	result
	Egress []struct {
		Host     string `json:"host"`
		Port     int    `json:"port"`
		BytesIn  int64  `json:"bytes_in"`
		BytesOut int64  `json:"bytes_out"`
		Allowed  bool   `json:"allowed"`
		Reason   string `json:"reason"`
		Count    int    `json:"count"`
	} `json:"egress"`
	Packages []string `json:"packages"`
}

func runEgress(t *testing.T, cs *mcp.ClientSession, args map[string]any) egressResult {
	t.Helper()
	var r egressResult
	res := call(t, cs, "run_code", args, &r)
	if res.IsError {
		t.Fatalf("run_code failed as a tool: %s", text(res))
	}
	return r
}

// refused reports whether the result lists a refusal of host whose
// reason says want.
func (r egressResult) refused(host, want string) bool {
	for _, e := range r.Egress {
		if !e.Allowed && e.Host == host && strings.Contains(e.Reason, want) {
			return true
		}
	}
	return false
}

const narrowToken = "narrow-token-0123456789"

func TestEgress(t *testing.T) {
	w := newWorld(t)
	clientsFile := filepath.Join(t.TempDir(), "clients.yaml")
	os.WriteFile(clientsFile, []byte("tiers:\n  narrow: {egress_domains: [other.test]}\nclients:\n  - {name: narrow, token: "+
		narrowToken+", tier: narrow}\n"), 0o600)
	s := start(t, options{env: append(w.env(), "CLIENTS_FILE="+clientsFile)})
	cs := s.session(nil)
	network := func(d ...string) map[string]any { return map[string]any{"allowed_domains": d} }

	t.Run("an allowed name is fetched, over HTTP and through CONNECT", func(t *testing.T) {
		code := fmt.Sprintf(`import os, ssl, urllib.request
print(urllib.request.urlopen("http://files.test:%d/hello").read().decode())
print(urllib.request.urlopen("https://secure.test:%d/hello", context=ssl._create_unverified_context()).read().decode())
print(os.environ["HTTP_PROXY"], os.environ["NO_PROXY"])`, w.files, w.secure)
		r := runEgress(t, cs, map[string]any{"language": "python", "conversationId": "net", "code": code,
			"network": network("files.test", "secure.test")})
		want := fmt.Sprintf("hello from files.test:%d\nhello from secure.test:%d\nhttp://127.0.0.1:3128 localhost,127.0.0.1,::1\n", w.files, w.secure)
		if r.Stdout != want {
			t.Fatalf("stdout %q, want %q (stderr %s)", r.Stdout, want, r.Stderr)
		}
		hosts := map[string]bool{}
		for _, e := range r.Egress {
			if e.Allowed && e.BytesIn > 0 && e.BytesOut > 0 {
				hosts[e.Host] = true
			}
		}
		if !hosts["files.test"] || !hosts["secure.test"] {
			t.Errorf("egress %+v: want both connections, with bytes", r.Egress)
		}
		// Each connection is an event of the run, and in the audit log.
		var prog struct {
			Events []struct {
				Type   string         `json:"type"`
				Egress map[string]any `json:"egress"`
			} `json:"events"`
		}
		call(t, cs, "get_run", map[string]any{"run_id": r.RunID}, &prog)
		n := 0
		for _, ev := range prog.Events {
			if ev.Type == "egress" && ev.Egress["host"] != nil {
				n++
			}
		}
		if n != len(r.Egress) {
			t.Errorf("%d egress events, %d connections", n, len(r.Egress))
		}
		waitFor(t, func() bool {
			_, out, _ := s.auditCmd("export")
			found := 0
			for _, l := range parseAudit(t, out) {
				if l.Route == "egress" && l.RunID == r.RunID && l.Phase == "event" && l.Params["allowed"] == true {
					found++
				}
			}
			return found == len(r.Egress)
		})
	})

	t.Run("what is refused, and recorded", func(t *testing.T) {
		redisPort := s.redisURL[strings.LastIndex(s.redisURL, ":")+1 : strings.LastIndex(s.redisURL, "/")]
		// NO_PROXY keeps loopback names off the proxy; a program bent on
		// reaching them through it drops that first.
		code := fmt.Sprintf(`import json, os, socket, ssl, urllib.request, urllib.error
for k in ("NO_PROXY", "no_proxy"):
    del os.environ[k]
out = {}
def fetch(name, u):
    try:
        urllib.request.urlopen(u, timeout=20, context=ssl._create_unverified_context() if u.startswith("https") else None).read()
        out[name] = "fetched"
    except urllib.error.HTTPError as e:
        out[name] = "http %%d" %% e.code
    except Exception as e:
        out[name] = "error " + str(e)
fetch("not asked", "http://other.test:%[1]d/hello")
fetch("ipv4 literal", "http://127.0.0.1:%[1]d/hello")
fetch("ipv6 literal", "http://[::1]:%[1]d/hello")
fetch("loopback name", "http://localhost/hello")
fetch("redis port", "http://files.test:%[2]s/")
fetch("connect not asked", "https://other.test/hello")
def raw(name, req):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=20)
    s.sendall(req.encode())
    out[name] = s.recv(100).decode().split("\r\n")[0]
raw("host header", "GET http://files.test:%[1]d/hello HTTP/1.1\r\nHost: other.test\r\n\r\n")
def attempt(name, f):
    try:
        f()
        out[name] = "reached"
    except OSError as e:
        out[name] = "refused"
attempt("raw tcp", lambda: socket.create_connection(("1.1.1.1", 80), timeout=5))
attempt("raw tcp to the host", lambda: socket.create_connection(("172.17.0.1", %[1]d), timeout=5))
attempt("udp", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("8.8.8.8", 53)))
attempt("dns", lambda: socket.getaddrinfo("files.test", 80))
print(json.dumps(out))`, w.files, redisPort)
		r := runEgress(t, cs, map[string]any{"language": "python", "conversationId": "net", "code": code,
			"network": network("files.test", "localhost")})
		var out map[string]string
		if err := json.Unmarshal([]byte(r.Stdout), &out); err != nil {
			t.Fatalf("%v: %q %s", err, r.Stdout, r.Stderr)
		}
		want := map[string]string{
			"not asked": "http 403", "ipv4 literal": "http 403", "ipv6 literal": "http 403", "loopback name": "http 403",
			"redis port": "http 403", "host header": "HTTP/1.1 403 Forbidden", "raw tcp": "refused", "raw tcp to the host": "refused",
			"udp": "refused", "dns": "refused",
		}
		if onKubernetes && !underGVisor() {
			// A pod has an interface and a route: sending a datagram
			// succeeds, and the NetworkPolicy drops it on the node
			// (package kubernetes' TestSandboxIsIsolatedFromItsFirstRun
			// listens for it and gets nothing). gVisor's pods have no
			// network stack (network=none): the send fails.
			want["udp"] = "reached"
		}
		for name, want := range want {
			if out[name] != want {
				t.Errorf("%s: %q, want %q", name, out[name], want)
			}
		}
		if !strings.Contains(out["connect not asked"], "403") {
			t.Errorf("CONNECT to a name not asked for: %q", out["connect not asked"])
		}
		for host, reason := range map[string]string{
			"other.test": "not among this run's network.allowed_domains", "127.0.0.1": "address literal", "::1": "address literal",
			"localhost": "resolves to a loopback address", "files.test": "port " + redisPort + " is not the port",
		} {
			if !r.refused(host, reason) {
				t.Errorf("no refusal of %s (%s) recorded: %+v", host, reason, r.Egress)
			}
		}
		if !r.refused("files.test", `the Host header names "other.test"`) {
			t.Errorf("the Host header's refusal is not recorded: %+v", r.Egress)
		}
	})

	t.Run("the proxy socket serves no run number a program forges", func(t *testing.T) {
		// The way out is a Unix socket the executor mounts: a program
		// can write to it directly, with any run number in the header.
		// In a run that asked for no network, after runs that did,
		// none is served.
		code := fmt.Sprintf(`import os, socket, stat, struct, sys
try:
    print(stat.S_ISSOCK(os.stat("/run/runbox/proxy.sock").st_mode))
except PermissionError:
    print("unreachable") # gVisor without --host-uds
    sys.exit()
except FileNotFoundError:
    print("absent") # a pod: egress goes over the agent's stream alone
    sys.exit()
answers = set()
for n in range(64):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(20)
    s.connect("/run/runbox/proxy.sock")
    s.sendall(b"P" + struct.pack(">I", n) + b"GET http://files.test:%d/hello HTTP/1.1\r\nHost: files.test:%[1]d\r\n\r\n")
    try:
        answers.add(s.recv(400).split(b"\r\n")[0].decode())
    except OSError as e:
        answers.add("closed")
    s.close()
print(sorted(answers))`, w.files)
		r := runEgress(t, cs, map[string]any{"language": "python", "conversationId": "net", "code": code})
		lines := strings.Split(strings.TrimSpace(r.Stdout), "\n")
		if onKubernetes {
			// No host folder reaches a pod, so no socket: nothing to forge.
			if r.Stdout != "absent\n" {
				t.Errorf("a sandbox pod has a proxy socket: %q %s", r.Stdout, r.Stderr)
			}
			return
		}
		if os.Getenv("SANDBOX_RUNTIME") == "runsc" && r.Stdout == "unreachable\n" {
			// A runsc registered without --host-uds=open (deploy/runsc.sh
			// adds it where it can): connections go as streams, as the
			// other subtests show.
			t.Log("gVisor without --host-uds=open: no proxy socket")
			return
		}
		if len(lines) != 2 || lines[0] != "True" {
			t.Fatalf("%q %s", r.Stdout, r.Stderr)
		}
		for _, a := range strings.Split(strings.Trim(lines[1], "[]"), ", ") {
			if a != "''" && a != "'closed'" && a != "'HTTP/1.1 403 Forbidden'" {
				t.Errorf("a forged run number was answered %s", a)
			}
		}
		if len(r.Egress) != 0 {
			t.Errorf("egress of a run without network: %+v", r.Egress)
		}
	})

	t.Run("the run's byte limit cuts a large download", func(t *testing.T) {
		code := fmt.Sprintf(`import urllib.request
try:
    n = len(urllib.request.urlopen("http://files.test:%d/big?n=%d").read())
    print("read", n)
except Exception as e:
    print("cut", type(e).__name__)`, w.files, 32<<20)
		r := runEgress(t, cs, map[string]any{"language": "python", "conversationId": "net", "code": code,
			"network": network("files.test")})
		if !strings.HasPrefix(r.Stdout, "cut") {
			t.Errorf("32 MB through a 16 MB limit: %q %s", r.Stdout, r.Stderr)
		}
		cut := false
		for _, e := range r.Egress {
			cut = cut || (e.Allowed && strings.Contains(e.Reason, "cut at the run's limit") && e.BytesIn <= 17<<20)
		}
		if !cut {
			t.Errorf("egress %+v", r.Egress)
		}
	})

	t.Run("a run that asks for nothing has no network", func(t *testing.T) {
		r := runEgress(t, cs, map[string]any{"language": "python", "conversationId": "net", "code": `import os, socket
print(os.environ.get("HTTP_PROXY"), os.environ.get("PIP_INDEX_URL"))
s = socket.create_connection(("127.0.0.1", 3128), timeout=20)
s.sendall(b"GET http://files.test/ HTTP/1.1\r\n\r\n")
print(s.recv(400).decode().split("\r\n\r\n")[1].strip())`})
		if r.Stdout != "None None\nrunbox egress: this run asked for no network: pass network.allowed_domains (within this client's allowlist)\n" ||
			len(r.Egress) != 0 {
			t.Errorf("%q %s %+v", r.Stdout, r.Stderr, r.Egress)
		}
	})

	t.Run("a domain outside the client's allowlist is a tool error", func(t *testing.T) {
		res := call(t, cs, "run_code", map[string]any{"language": "python", "code": "print(1)", "network": network("files.test", "evil.example")}, nil)
		if code, _ := toolErrorOf(res); code != "egress_denied" || !strings.Contains(text(res), "evil.example") {
			t.Errorf("%s", text(res))
		}
		// A second client's tier without the domain.
		narrow := s.sessionAs(narrowToken)
		res = call(t, narrow, "run_code", map[string]any{"language": "python", "code": "print(1)", "network": network("files.test")}, nil)
		if code, _ := toolErrorOf(res); code != "egress_denied" || !strings.Contains(text(res), "files.test") {
			t.Errorf("narrow tier: %s", text(res))
		}
		// What its tier has, it gets.
		r := runEgress(t, narrow, map[string]any{"language": "python", "code": fmt.Sprintf(
			`import urllib.request; print(urllib.request.urlopen("http://other.test:%d/hello").read().decode())`, w.files),
			"network": network("other.test")})
		if r.Stdout != fmt.Sprintf("hello from other.test:%d\n", w.files) {
			t.Errorf("narrow tier's own domain: %q %s", r.Stdout, r.Stderr)
		}
		// Its packages install only from what its tier allows: pip says why not.
		r = runEgress(t, narrow, map[string]any{"language": "python", "code": "print(1)", "packages": []string{"tinypkg"}})
		if r.Success || !strings.Contains(r.Error, "installing packages failed") || !strings.Contains(r.Error, "tinypkg") ||
			!strings.Contains(r.Error, "ERROR") || !r.refused("pypi.test", "not among") {
			t.Errorf("an index the tier does not allow: %+v", r)
		}
		// npm the same: its registry is not the tier's.
		r = runEgress(t, narrow, map[string]any{"language": "typescript", "code": "1", "packages": []string{"tinynpm@1.0.0"}})
		if r.Success || !strings.Contains(r.Error, "installing packages failed") || !strings.Contains(r.Error, "tinynpm") ||
			!r.refused("npm.test", "not among") {
			t.Errorf("a registry the tier does not allow: %+v", r)
		}
	})

	t.Run("the run tools say they may reach the world", func(t *testing.T) {
		list, err := cs.ListTools(context.Background(), nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, tool := range list.Tools {
			open := *tool.Annotations.OpenWorldHint
			if want := slices.Contains([]string{"run_code", "start_run", "start_batch", "execute_code", "execute_code_async"}, tool.Name); open != want {
				t.Errorf("%s: openWorldHint %v", tool.Name, open)
			}
		}
	})
}

func TestPackages(t *testing.T) {
	w := newWorld(t)
	s := start(t, options{env: w.env()})
	cs := s.session(nil)

	t.Run("pip", func(t *testing.T) {
		// A kept interpreter started before the install sees it too.
		runEgress(t, cs, map[string]any{"language": "python", "conversationId": "pip", "code": "before = 1", "keep_state": true})
		r := runEgress(t, cs, map[string]any{"language": "python", "conversationId": "pip", "packages": []string{"tinypkg==0.1.0"},
			"code": "import tinypkg\nprint(tinypkg.X, tinypkg.__file__)"})
		if !r.Success || !strings.HasPrefix(r.Stdout, "42 /data/.packages/python/lib/python3") {
			t.Fatalf("install and import: %+v", r)
		}
		if len(r.Packages) != 1 || r.Packages[0] != "tinypkg==0.1.0" {
			t.Errorf("packages %v", r.Packages)
		}
		for _, f := range r.Files {
			if strings.HasPrefix(f.Name, ".packages") {
				t.Errorf("the installed files are listed: %s", f.Name)
			}
		}
		if !w.index.fetched("tinypkg-0.1.0-py3-none-any.whl") {
			t.Error("the wheel was not fetched from the index")
		}
		// The next run, and the kept interpreter, import it without asking.
		r = runEgress(t, cs, map[string]any{"language": "python", "conversationId": "pip", "code": "import tinypkg\nprint(tinypkg.X)"})
		if r.Stdout != "42\n" || len(r.Egress) != 0 {
			t.Errorf("next run: %+v", r)
		}
		r = runEgress(t, cs, map[string]any{"language": "python", "conversationId": "pip", "keep_state": true,
			"code": "import tinypkg\n(before, tinypkg.X)"})
		if r.Stdout != "(1, 42)\n" {
			t.Errorf("kept interpreter: %q %s", r.Stdout, r.Stderr)
		}
	})

	t.Run("pip counts against the quota", func(t *testing.T) {
		r := runEgress(t, cs, map[string]any{"language": "python", "conversationId": "pip-big", "packages": []string{"bigpkg"}, "code": "print(1)"})
		// Loop mode: the disk image is full (pip's ENOSPC); walk mode: the
		// quota watcher stops the install.
		if r.Success || !strings.Contains(r.Error, "No space left on device") && !strings.Contains(r.Error, "quota") {
			t.Errorf("a package of 12 MB in an 8 MB quota: %+v", r)
		}
	})

	t.Run("a package the index does not have", func(t *testing.T) {
		r := runEgress(t, cs, map[string]any{"language": "python", "conversationId": "pip", "packages": []string{"nosuchpkg"}, "code": "print(1)"})
		if r.Success || !strings.Contains(r.Error, "No matching distribution found for nosuchpkg") {
			t.Errorf("%+v", r)
		}
	})

	t.Run("npm", func(t *testing.T) {
		r := runEgress(t, cs, map[string]any{"language": "typescript", "conversationId": "npm", "packages": []string{"tinynpm@1.0.0"},
			"code": "import { x } from \"tinynpm\";\nconst n: number = x;\nconsole.log(n);"})
		if !r.Success || r.Stdout != "42\n" {
			t.Fatalf("install and import: %+v", r)
		}
		if len(r.Packages) != 1 || r.Packages[0] != "tinynpm@1.0.0" {
			t.Errorf("packages %v", r.Packages)
		}
		r = runEgress(t, cs, map[string]any{"language": "typescript", "conversationId": "npm", "code": "import { x } from \"tinynpm\";\nconsole.log(x + 1);"})
		if r.Stdout != "43\n" {
			t.Errorf("next run: %+v", r)
		}
		r = runEgress(t, cs, map[string]any{"language": "typescript", "conversationId": "npm", "packages": []string{"nosuchnpm"}, "code": "1"})
		if r.Success || !strings.Contains(r.Error, "installing packages failed") || !strings.Contains(r.Error, "404") {
			t.Errorf("a package the registry does not have: %+v", r)
		}
	})

	t.Run("npm counts against the quota", func(t *testing.T) {
		r := runEgress(t, cs, map[string]any{"language": "typescript", "conversationId": "npm-big", "packages": []string{"bignpm@1.0.0"}, "code": "1"})
		// Loop mode: npm's ENOSPC; walk mode: the quota watcher stops it.
		if r.Success || !strings.Contains(r.Error, "ENOSPC") && !strings.Contains(r.Error, "no space left") && !strings.Contains(r.Error, "quota") {
			t.Errorf("a package of 12 MB in an 8 MB quota: %+v", r)
		}
	})
}

// packageIndex is a PEP 503 index and an npm registry of packages made
// here: tinypkg (a module), bigpkg (12 MB of data), tinynpm and bignpm
// (12 MB of data).
type packageIndex struct {
	wheels map[string][]byte // by file name
	npm    map[string][]byte // tarballs of version 1.0.0, by name
	hits   chan string
}

func newPackageIndex(t *testing.T) *packageIndex {
	t.Helper()
	// bigpkg: a small wheel (its files compress well) that installs 12 MB,
	// no one file larger than RLIMIT_FSIZE (the quota).
	big := map[string][]byte{"bigpkg/__init__.py": nil}
	for i := range 4 {
		big[fmt.Sprintf("bigpkg/blob%d.bin", i)] = make([]byte, 3<<20)
	}
	return &packageIndex{
		wheels: map[string][]byte{
			"tinypkg-0.1.0-py3-none-any.whl": wheel(t, "tinypkg", "0.1.0", map[string][]byte{"tinypkg/__init__.py": []byte("X = 42\n")}),
			"bigpkg-1.0-py3-none-any.whl":    wheel(t, "bigpkg", "1.0", big),
		},
		npm: map[string][]byte{
			"tinynpm": npmTarball(t, map[string]string{
				"package/package.json": `{"name": "tinynpm", "version": "1.0.0", "type": "module", "main": "index.js"}`,
				"package/index.js":     "export const x = 42;\n",
			}),
			"bignpm": npmTarball(t, bigNPM),
		},
		hits: make(chan string, 100),
	}
}

func (p *packageIndex) fetched(name string) bool {
	for {
		select {
		case h := <-p.hits:
			if h == name {
				return true
			}
		default:
			return false
		}
	}
}

// pypi serves /simple/<project>/ and /files/<wheel>.
func (p *packageIndex) pypi() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/simple/{project}/", func(w http.ResponseWriter, r *http.Request) {
		var links strings.Builder
		for name, b := range p.wheels {
			if strings.HasPrefix(name, r.PathValue("project")+"-") {
				sum := sha256.Sum256(b)
				fmt.Fprintf(&links, "<a href=\"/files/%s#sha256=%s\">%[1]s</a>\n", name, hex.EncodeToString(sum[:]))
			}
		}
		if links.Len() == 0 {
			http.NotFound(w, r)
			return
		}
		fmt.Fprintf(w, "<!DOCTYPE html><html><body>\n%s</body></html>\n", links.String())
	})
	mux.HandleFunc("/files/{name}", func(w http.ResponseWriter, r *http.Request) {
		b, ok := p.wheels[r.PathValue("name")]
		if !ok {
			http.NotFound(w, r)
			return
		}
		select {
		case p.hits <- r.PathValue("name"):
		default:
		}
		w.Write(b)
	})
	return mux
}

// bigNPM is bignpm's files: 12 MB that compress well, no one file larger
// than RLIMIT_FSIZE (the quota).
var bigNPM = func() map[string]string {
	files := map[string]string{
		"package/package.json": `{"name": "bignpm", "version": "1.0.0", "main": "index.js"}`,
		"package/index.js":     "module.exports = 1;\n",
	}
	for i := range 4 {
		files[fmt.Sprintf("package/blob%d.bin", i)] = strings.Repeat("\x00", 3<<20)
	}
	return files
}()

// npmRegistry serves the packument of each package and its tarball.
func (p *packageIndex) npmRegistry(port func() int) http.Handler {
	mux := http.NewServeMux()
	for name, tgz := range p.npm {
		mux.HandleFunc("/"+name, func(w http.ResponseWriter, r *http.Request) {
			sha1sum := sha1.Sum(tgz)
			sha512sum := sha512.Sum512(tgz)
			doc := map[string]any{
				"name": name, "dist-tags": map[string]string{"latest": "1.0.0"},
				"versions": map[string]any{"1.0.0": map[string]any{
					"name": name, "version": "1.0.0",
					"dist": map[string]string{
						"tarball":   fmt.Sprintf("http://npm.test:%d/%s/-/%[2]s-1.0.0.tgz", port(), name),
						"shasum":    hex.EncodeToString(sha1sum[:]),
						"integrity": "sha512-" + base64.StdEncoding.EncodeToString(sha512sum[:]),
					},
				}},
			}
			w.Header().Set("Content-Type", "application/json")
			json.NewEncoder(w).Encode(doc)
		})
		mux.HandleFunc("/"+name+"/-/"+name+"-1.0.0.tgz", func(w http.ResponseWriter, r *http.Request) { w.Write(tgz) })
	}
	return mux
}

// wheel makes a pure-Python wheel of files.
func wheel(t *testing.T, name, version string, files map[string][]byte) []byte {
	t.Helper()
	info := name + "-" + version + ".dist-info/"
	files[info+"METADATA"] = []byte("Metadata-Version: 2.1\nName: " + name + "\nVersion: " + version + "\n")
	files[info+"WHEEL"] = []byte("Wheel-Version: 1.0\nGenerator: runbox-e2e\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
	var record strings.Builder
	var buf bytes.Buffer
	z := zip.NewWriter(&buf)
	for path, b := range files {
		sum := sha256.Sum256(b)
		fmt.Fprintf(&record, "%s,sha256=%s,%d\n", path, base64.RawURLEncoding.EncodeToString(sum[:]), len(b))
		f, err := z.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		f.Write(b)
	}
	record.WriteString(info + "RECORD,,\n")
	f, _ := z.Create(info + "RECORD")
	f.Write([]byte(record.String()))
	if err := z.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func npmTarball(t *testing.T, files map[string]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for name, content := range files {
		tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(content)), ModTime: time.Unix(0, 0)})
		tw.Write([]byte(content))
	}
	tw.Close()
	gz.Close()
	return buf.Bytes()
}

// TestEgressNotRecycled: a sandbox whose conversation had network, handed
// to another conversation, carries none of it over.
func TestEgressNotRecycled(t *testing.T) {
	w := newWorld(t)
	s := start(t, options{env: append(w.env(), "SANDBOX_MAX_WARM=1", "SANDBOX_POOL=0")})
	cs := s.session(nil)
	// Through the proxy whether the run asked for it or not.
	fetch := fmt.Sprintf(`import socket, urllib.request
print(socket.gethostname())
proxied = urllib.request.build_opener(urllib.request.ProxyHandler({"http": "http://127.0.0.1:3128"}))
try:
    print(proxied.open("http://files.test:%d/hello", timeout=20).read().decode())
except Exception as e:
    print(e)`, w.files)
	first := runEgress(t, cs, map[string]any{"language": "python", "conversationId": "first", "code": fetch,
		"network": map[string]any{"allowed_domains": []string{"files.test"}}})
	host, _, _ := strings.Cut(first.Stdout, "\n")
	if !strings.Contains(first.Stdout, "hello from files.test") {
		t.Fatalf("first: %+v", first)
	}
	runEgress(t, cs, map[string]any{"language": "python", "conversationId": "second", "code": "print(1)"})
	waitFor(t, func() bool { return s.recycled() == 1 })
	third := runEgress(t, cs, map[string]any{"language": "python", "conversationId": "third", "code": fetch})
	if h, _, _ := strings.Cut(third.Stdout, "\n"); h != host {
		t.Fatalf("the third conversation did not get the recycled sandbox: %q, %q", h, host)
	}
	if !strings.Contains(third.Stdout, "403") || len(third.Egress) != 0 {
		t.Errorf("the recycled sandbox's next conversation reached out: %+v", third)
	}
}
