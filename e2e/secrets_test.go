package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io/fs"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// headerLog keeps the headers a server on loopback was sent.
type headerLog struct {
	mu   sync.Mutex
	seen []http.Header
}

func (l *headerLog) handler(reflect bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		l.mu.Lock()
		l.seen = append(l.seen, r.Header.Clone())
		l.mu.Unlock()
		if reflect {
			// A server that echoes what it was sent, as some do: the
			// proxy must not let the value back to the program.
			w.Header().Set("X-Echo", r.Header.Get("Authorization"))
			json.NewEncoder(w).Encode(map[string]string{"authorization": r.Header.Get("Authorization"), "copy": r.Header.Get("X-Copy")})
			return
		}
		fmt.Fprint(w, "ok")
	})
}

func (l *headerLog) all() []http.Header {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.seen)
}

// upstreamCA is the authority of the tests' HTTPS servers, trusted by the
// proxy through SANDBOX_EGRESS_CA_FILE, as an operator's internal CA is.
type upstreamCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	file string
}

func newUpstreamCA(t *testing.T) *upstreamCA {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "e2e upstream CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour), IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	file := filepath.Join(t.TempDir(), "upstream-ca.pem")
	os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
	return &upstreamCA{cert: cert, key: key, file: file}
}

// serveTLS serves h over HTTPS on loopback with a certificate for name.
func (ca *upstreamCA) serveTLS(t *testing.T, h http.Handler, name string) int {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		DNSNames: []string{name}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(h)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return urlPort(srv.URL)
}

func urlPort(u string) int {
	var p int
	fmt.Sscanf(u[strings.LastIndex(u, ":")+1:], "%d", &p)
	return p
}

const noSecretsToken = "no-secrets-token-0123456789"

// TestSecrets: a secret reaches a server on loopback, over HTTPS, under its
// header, from Python (urllib, requests), Node and curl, while the
// program's environment, output, files, events, the audit log, Redis and
// the processes' logs hold only its placeholder; a request to another
// allowed domain carries the placeholder, never the value.
func TestSecrets(t *testing.T) {
	value := "sk-e2e-" + strings.ToLower(rand.Text())
	placeholder := "runbox-secret-svc-placeholder"
	ca := newUpstreamCA(t)
	api, plain, other := &headerLog{}, &headerLog{}, &headerLog{}
	apiPort := ca.serveTLS(t, api.handler(true), "api.secret.test")
	otherPort := ca.serveTLS(t, other.handler(false), "other.test")
	plainPort := loopback(t, plain.handler(false))

	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "svc.key"), []byte(value+"\n"), 0o600)
	secretsFile := filepath.Join(dir, "secrets.yaml")
	os.WriteFile(secretsFile, []byte("secrets:\n  svc:\n    value_file: svc.key\n    domains: [api.secret.test]\n"+
		"    header: Authorization\n    format: \"Bearer {value}\"\n"), 0o600)
	clientsFile := filepath.Join(dir, "clients.yaml")
	os.WriteFile(clientsFile, []byte("tiers:\n  plain: {secrets: []}\nclients:\n  - {name: nosecrets, token: "+noSecretsToken+", tier: plain}\n"), 0o600)
	s := start(t, options{env: []string{
		// api.secret.test is no domain any client may ask for: the secret
		// brings it.
		"SANDBOX_EGRESS_ALLOW=plain.test,other.test",
		fmt.Sprintf("SANDBOX_EGRESS_HOSTS=api.secret.test=127.0.0.1:%d,other.test=127.0.0.1:%d,plain.test=127.0.0.1:%d", apiPort, otherPort, plainPort),
		"SANDBOX_SECRETS_FILE=" + secretsFile,
		"SANDBOX_EGRESS_CA_FILE=" + ca.file,
		"CLIENTS_FILE=" + clientsFile,
		"AUDIT_KEY=" + auditKey,
	}})
	cs := s.session(nil)
	apiURL := fmt.Sprintf("https://api.secret.test:%d/echo", apiPort)
	var runs []string

	// checkAPI checks that the n requests api.secret.test got since from
	// carried the value, in the header and where the program put the
	// placeholder.
	checkAPI := func(t *testing.T, from, n int) {
		t.Helper()
		got := api.all()[from:]
		if len(got) != n {
			t.Fatalf("api.secret.test got %d requests, want %d", len(got), n)
		}
		for _, h := range got {
			if h.Get("Authorization") != "Bearer "+value || h.Get("X-Copy") != value {
				t.Errorf("api.secret.test was sent Authorization %q, X-Copy %q", h.Get("Authorization"), h.Get("X-Copy"))
			}
		}
	}

	t.Run("python: urllib and requests", func(t *testing.T) {
		from := len(api.all())
		code := fmt.Sprintf(`import json, os, ssl, urllib.request
from pip._vendor import requests
ph = os.environ["SVC"]
print("env", ph)
u = %[1]q
a = urllib.request.urlopen(urllib.request.Request(u, headers={"Authorization": "Bearer " + ph, "X-Copy": ph}))
print("urllib", a.headers["X-Echo"], a.read().decode().strip())
b = requests.get(u, headers={"X-Copy": ph})
print("requests", b.headers["X-Echo"], b.text.strip())
# Other allowed domains: plain HTTP, and an opaque tunnel.
urllib.request.urlopen(urllib.request.Request("http://plain.test:%[2]d/", headers={"Authorization": "Bearer " + ph})).read()
urllib.request.urlopen(urllib.request.Request("https://other.test:%[3]d/", headers={"Authorization": "Bearer " + ph}),
    context=ssl._create_unverified_context()).read()
with open("/data/out.txt", "w") as f:
    f.write(json.dumps(dict(os.environ)))
`, apiURL, plainPort, otherPort)
		r := runEgress(t, cs, map[string]any{"language": "python", "conversationId": "secrets", "code": code,
			"network": map[string]any{"allowed_domains": []string{"plain.test", "other.test"}}, "secrets": []string{"svc"}})
		runs = append(runs, r.RunID)
		echo := fmt.Sprintf(`{"authorization":"Bearer %s","copy":"%[1]s"}`, placeholder)
		want := fmt.Sprintf("env %s\nurllib Bearer %[1]s %s\nrequests Bearer %[1]s %[2]s\n", placeholder, echo)
		if !r.Success || r.Stdout != want {
			t.Fatalf("stdout %q, want %q (stderr %s)", r.Stdout, want, r.Stderr)
		}
		checkAPI(t, from, 2)
		for name, l := range map[string]*headerLog{"plain.test": plain, "other.test": other} {
			if got := l.all(); len(got) != 1 || got[0].Get("Authorization") != "Bearer "+placeholder {
				t.Errorf("%s was sent %v", name, got)
			}
		}
		found := false
		for _, e := range r.Egress {
			if e.Host == "api.secret.test" {
				found = e.Allowed && e.BytesIn > 0
			}
		}
		if !found {
			t.Errorf("egress %+v", r.Egress)
		}
		var full struct {
			Egress []struct {
				Host    string   `json:"host"`
				Secrets []string `json:"secrets"`
			} `json:"egress"`
		}
		call(t, cs, "get_run", map[string]any{"run_id": r.RunID}, &full)
		for _, e := range full.Egress {
			if want := e.Host == "api.secret.test"; want != slices.Equal(e.Secrets, []string{"svc"}) {
				t.Errorf("%s's record names secrets %v", e.Host, e.Secrets)
			}
		}
	})

	t.Run("node", func(t *testing.T) {
		// Node's own https does not read HTTPS_PROXY: the program
		// tunnels itself, and Node's TLS checks the proxy's certificate
		// against its roots and NODE_EXTRA_CA_CERTS.
		from := len(api.all())
		code := fmt.Sprintf(`import http from "node:http";
import tls from "node:tls";
const ph = process.env.SVC;
const req = http.request({ host: "127.0.0.1", port: 3128, method: "CONNECT", path: "api.secret.test:%[1]d",
  headers: { Host: "api.secret.test:%[1]d" } });
req.on("connect", (res, socket) => {
  const s = tls.connect({ socket, servername: "api.secret.test" }, () => {
    s.write("GET /echo HTTP/1.1\r\nHost: api.secret.test:%[1]d\r\nAuthorization: Bearer " + ph + "\r\nX-Copy: " + ph + "\r\nConnection: close\r\n\r\n");
  });
  let data = "";
  s.on("data", (d) => (data += d));
  s.on("end", () => console.log(data.split("\r\n\r\n")[1]));
  s.on("error", (e) => { console.log("error", e.code || e.message); process.exit(1); });
});
req.end();
`, apiPort)
		r := runEgress(t, cs, map[string]any{"language": "typescript", "conversationId": "secrets-node", "code": code, "secrets": []string{"svc"}})
		runs = append(runs, r.RunID)
		if !r.Success || !strings.Contains(r.Stdout, `"authorization":"Bearer `+placeholder+`"`) {
			t.Fatalf("stdout %q (stderr %s)", r.Stdout, r.Stderr)
		}
		checkAPI(t, from, 1)
	})

	t.Run("curl through execute_code", func(t *testing.T) {
		from := len(api.all())
		o := execute(t, cs, map[string]any{"command": fmt.Sprintf(`curl -sS --fail -H "X-Copy: $SVC" -H "Authorization: Bearer $SVC" %s`, apiURL),
			"secrets": []string{"svc"}})
		if o.Status != "completed" || o.ExitCode == nil || *o.ExitCode != 0 || !strings.Contains(strings.Join(o.lines("stdout"), ""), placeholder) {
			t.Fatalf("%+v", o)
		}
		runs = append(runs, o.ExecutionID)
		checkAPI(t, from, 1)
	})

	t.Run("a client whose tier has no secrets", func(t *testing.T) {
		res := call(t, s.sessionAs(noSecretsToken), "run_code", map[string]any{"language": "python", "code": "print(1)", "secrets": []string{"svc"}}, nil)
		if code, _ := toolErrorOf(res); code != "egress_denied" || !strings.Contains(text(res), "svc") {
			t.Errorf("%s", text(res))
		}
		res = call(t, cs, "run_code", map[string]any{"language": "python", "code": "print(1)", "secrets": []string{"nosuch"}}, nil)
		if code, _ := toolErrorOf(res); code != "egress_denied" {
			t.Errorf("an unknown secret: %s", text(res))
		}
	})

	t.Run("REST", func(t *testing.T) {
		from := len(api.all())
		var r egressResult
		code := fmt.Sprintf(`import os, urllib.request
print(urllib.request.urlopen(%q).headers["X-Echo"] == "Bearer " + os.environ["SVC"])`, apiURL)
		if st := s.request("POST", "/v1/runs?wait=true", map[string]any{"language": "python", "code": code, "secrets": []string{"svc"}}, &r); st != 200 {
			t.Fatalf("status %d", st)
		}
		runs = append(runs, r.RunID)
		if r.Stdout != "True\n" {
			t.Fatalf("%+v", r)
		}
		if got := api.all()[from:]; len(got) != 1 || got[0].Get("Authorization") != "Bearer "+value {
			t.Errorf("sent %v", got)
		}
	})

	// Nowhere but at the server: not in what clients see of the runs, not
	// in the audit log, Redis, the logs, or the files.
	t.Run("the value is nowhere else", func(t *testing.T) {
		for _, id := range runs {
			var prog map[string]any
			call(t, cs, "get_run", map[string]any{"run_id": id}, &prog)
			if b, _ := json.Marshal(prog); strings.Contains(string(b), value) {
				t.Errorf("run %s: the value is shown: %s", id, b)
			}
		}
		waitFor(t, func() bool {
			_, out, _ := s.auditCmd("export")
			for _, l := range parseAudit(t, out) {
				if l.Route == "egress" && l.Params["host"] == "api.secret.test" {
					return true
				}
			}
			return false
		})
		_, out, _ := s.auditCmd("export")
		if strings.Contains(out, value) {
			t.Error("the audit log holds the value")
		}
		if !strings.Contains(out, `"secrets":["svc"]`) {
			t.Error("the audit log does not name the secret used")
		}
		if where := redisHolds(t, s.redisURL, value); where != "" {
			t.Errorf("Redis holds the value in %s", where)
		}
		for _, p := range s.procs {
			if strings.Contains(p.out.String(), value) {
				t.Errorf("the log of %s holds the value", p.name)
			}
		}
		files := 0
		filepath.WalkDir(s.root, func(path string, d fs.DirEntry, err error) error {
			if err != nil || !d.Type().IsRegular() || d.Name() == "files.img" {
				return nil // a loop-mounted image is walked through its mount
			}
			b, _ := os.ReadFile(path)
			if strings.Contains(string(b), value) {
				t.Errorf("%s holds the value", path)
			}
			if filepath.Base(path) == "out.txt" {
				files++
				if !strings.Contains(string(b), `"SVC": "`+placeholder+`"`) {
					t.Errorf("the program's environment, as it wrote it: %s", b)
				}
			}
			return nil
		})
		if files != 1 {
			t.Errorf("%d out.txt files", files)
		}
	})
}

// redisHolds returns the key of Redis whose value holds s, if one does.
func redisHolds(t *testing.T, url, s string) string {
	t.Helper()
	opt, err := redis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	ctx := context.Background()
	iter := rdb.Scan(ctx, 0, "*", 1000).Iterator()
	for iter.Next(ctx) {
		key := iter.Val()
		var dump string
		switch rdb.Type(ctx, key).Val() {
		case "string":
			dump = rdb.Get(ctx, key).Val()
		case "hash":
			dump = fmt.Sprint(rdb.HGetAll(ctx, key).Val())
		case "list":
			dump = fmt.Sprint(rdb.LRange(ctx, key, 0, -1).Val())
		case "set":
			dump = fmt.Sprint(rdb.SMembers(ctx, key).Val())
		case "zset":
			dump = fmt.Sprint(rdb.ZRange(ctx, key, 0, -1).Val())
		case "stream":
			dump = fmt.Sprint(rdb.XRange(ctx, key, "-", "+").Val())
		}
		if strings.Contains(key+dump, s) {
			return key
		}
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	return ""
}
