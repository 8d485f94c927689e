package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/runbox-dev/runbox/internal/e2b/e2bclient"
	fspb "github.com/runbox-dev/runbox/internal/e2b/envdpb/filesystem"
	"github.com/runbox-dev/runbox/internal/e2b/envdpb/filesystem/filesystempbconnect"
	ppb "github.com/runbox-dev/runbox/internal/e2b/envdpb/process"
	"github.com/runbox-dev/runbox/internal/e2b/envdpb/process/processpbconnect"
)

// The E2B-compatible API end to end: a Go client generated from runbox's
// .proto files (connect-go) and its control plane's OpenAPI
// (oapi-codegen), against one service with two clients, real Redis and
// Docker. Each method is called, and each new door attacked.

// e2bUploadLimit is the service's upload bound (SANDBOX_MAX_UPLOAD_BYTES).
const e2bUploadLimit = 4 << 20

// e2bAPI is a client's control plane.
type e2bAPI struct {
	t   *testing.T
	c   *e2bclient.ClientWithResponses
	tok string
}

func (s *service) e2bAPI(t *testing.T, tok string) *e2bAPI {
	c, err := e2bclient.NewClientWithResponses(s.url+"/e2b", e2bclient.WithRequestEditorFn(
		func(_ context.Context, r *http.Request) error { r.Header.Set("X-API-Key", tok); return nil }))
	if err != nil {
		t.Fatal(err)
	}
	return &e2bAPI{t: t, c: c, tok: tok}
}

// e2bSandbox is a sandbox and its clients, by header routing.
type e2bSandbox struct {
	s               *service
	id              string
	access, traffic string
	procs           processpbconnect.ProcessClient
	fs              filesystempbconnect.FilesystemClient
	http            *http.Client // sends the routing headers and the access token
}

// sandboxHeaders adds E2B's routing headers and a token to every request.
type sandboxHeaders struct {
	id, token string
	port      int
}

func (h sandboxHeaders) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("E2b-Sandbox-Id", h.id)
	r.Header.Set("E2b-Sandbox-Port", fmt.Sprint(h.port))
	if h.token != "" {
		r.Header.Set("X-Access-Token", h.token)
	}
	return http.DefaultTransport.RoundTrip(r)
}

func (s *service) e2bSandbox(id, access, traffic string, port int) *e2bSandbox {
	hc := &http.Client{Transport: sandboxHeaders{id: id, token: access, port: port}}
	return &e2bSandbox{s: s, id: id, access: access, traffic: traffic, http: hc,
		procs: processpbconnect.NewProcessClient(hc, s.url+"/e2b"),
		fs:    filesystempbconnect.NewFilesystemClient(hc, s.url+"/e2b", connect.WithProtoJSON())}
}

// killAll kills every sandbox of the client's.
func (a *e2bAPI) killAll() {
	r, err := a.c.ListSandboxesWithResponse(context.Background(), nil)
	if err != nil || r.JSON200 == nil {
		return
	}
	for _, sb := range *r.JSON200 {
		_, _ = a.c.KillSandboxWithResponse(context.Background(), sb.SandboxID)
	}
}

func (a *e2bAPI) create(body e2bclient.NewSandbox) (*e2bclient.Sandbox, int) {
	a.t.Helper()
	resp, err := a.c.CreateSandboxWithResponse(context.Background(), body)
	if err != nil {
		a.t.Fatal(err)
	}
	return resp.JSON201, resp.StatusCode()
}

// sandbox creates a sandbox from a template and returns its clients.
func (a *e2bAPI) sandbox(s *service, template string, timeout int32, md map[string]string) *e2bSandbox {
	a.t.Helper()
	meta := e2bclient.SandboxMetadata(md)
	sb, code := a.create(e2bclient.NewSandbox{TemplateID: template, Timeout: &timeout, Metadata: &meta})
	if code != http.StatusCreated || sb.EnvdVersion != "0.6.4" || sb.EnvdAccessToken == nil || sb.TrafficAccessToken == nil {
		a.t.Fatalf("create %s: %d %+v", template, code, sb)
	}
	return s.e2bSandbox(sb.SandboxID, *sb.EnvdAccessToken, *sb.TrafficAccessToken, 49983)
}

func e2bCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// run runs a command as E2B's SDK does and returns its output and end.
func (b *e2bSandbox) run(t *testing.T, command string, hdr http.Header, envs map[string]string) (string, string, *ppb.ProcessEvent_EndEvent, error) {
	t.Helper()
	req := connect.NewRequest(&ppb.StartRequest{Process: &ppb.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", command}, Envs: envs}})
	for k, v := range hdr {
		req.Header()[k] = v
	}
	stream, err := b.procs.Start(e2bCtx(t), req)
	if err != nil {
		return "", "", nil, err
	}
	defer stream.Close()
	var out, errOut strings.Builder
	for stream.Receive() {
		ev := stream.Msg().GetEvent()
		out.Write(ev.GetData().GetStdout())
		errOut.Write(ev.GetData().GetStderr())
		if end := ev.GetEnd(); end != nil {
			return out.String(), errOut.String(), end, nil
		}
	}
	return out.String(), errOut.String(), nil, stream.Err()
}

func (b *e2bSandbox) mustRun(t *testing.T, command string) string {
	t.Helper()
	out, errOut, end, err := b.run(t, command, nil, nil)
	if err != nil || end.GetExitCode() != 0 {
		t.Fatalf("%s: %v %v %q", command, err, end, errOut)
	}
	return out
}

// TestE2B drives the E2B-compatible API through each of its methods and
// attacks its doors, on one service (~30 s with the race detector).
func TestE2B(t *testing.T) {
	s := start(t, options{env: []string{
		"MCP_API_TOKENS=alice:" + aliceToken + ",bob:" + bobToken,
		fmt.Sprintf("SANDBOX_MAX_UPLOAD_BYTES=%d", e2bUploadLimit),
	}})
	alice, bob := s.e2bAPI(t, aliceToken), s.e2bAPI(t, bobToken)
	// Every sandbox left goes before the service stops (whose executor
	// would wait for their daemons).
	t.Cleanup(func() { alice.killAll(); bob.killAll() })
	// Sandboxes whose timeout comes while the rest runs.
	short := alice.sandbox(s, "base", 2, nil)
	autoPause := true
	two := int32(2)
	paused, code := alice.create(e2bclient.NewSandbox{TemplateID: "base", Timeout: &two, AutoPause: &autoPause})
	if code != http.StatusCreated {
		t.Fatalf("create with autoPause: %d", code)
	}
	sb := alice.sandbox(s, "base", 300, map[string]string{"suite": "e2b"})
	t.Run("commands", func(t *testing.T) { e2bCommands(t, sb) })
	t.Run("background and input", func(t *testing.T) { e2bBackground(t, sb) })
	t.Run("pty", func(t *testing.T) { e2bPTY(t, sb) })
	t.Run("files", func(t *testing.T) { e2bFiles(t, sb) })
	t.Run("filesystem and watchers", func(t *testing.T) { e2bFilesystem(t, sb) })
	t.Run("interpreter", func(t *testing.T) { e2bInterpreter(t, alice.sandbox(s, "code-interpreter-v1", 300, nil)) })
	t.Run("another client", func(t *testing.T) { e2bAnotherClient(t, s, alice, bob, sb) })
	t.Run("tokens", func(t *testing.T) { e2bTokens(t, s, bob, sb) })
	t.Run("ports", func(t *testing.T) { e2bPorts(t, s, sb) })
	t.Run("bodies", func(t *testing.T) { e2bBodies(t, s, sb) })
	t.Run("traversal", func(t *testing.T) { e2bTraversal(t, s, alice, sb) })
	t.Run("pty flood", func(t *testing.T) { e2bFlood(t, s, sb) })
	t.Run("timeouts", func(t *testing.T) { e2bTimeouts(t, alice, short, paused.SandboxID) })
	t.Run("auto resume", func(t *testing.T) { e2bAutoResume(t, s, alice) })
	t.Run("lifecycle", func(t *testing.T) { e2bLifecycle(t, alice, sb) })
}

// e2bCommands: output, exit codes, environment, working directory, the
// sandbox's user (not root, no capabilities), root refused, a stream's
// timeout.
func e2bCommands(t *testing.T, sb *e2bSandbox) {
	out, _, end, err := sb.run(t, `echo "$FOO"; pwd; id -un; grep CapEff /proc/self/status; exit 3`, nil, map[string]string{"FOO": "bar"})
	if err != nil || end.GetExitCode() != 3 || out != "bar\n/home/user\nuser\nCapEff:\t0000000000000000\n" {
		t.Errorf("run: %q %v %v", out, end, err)
	}
	if out := sb.mustRun(t, "sudo id -u"); out != "1000\n" {
		t.Errorf("sudo: %q", out)
	}
	root := http.Header{"Authorization": {"Basic " + base64.StdEncoding.EncodeToString([]byte("root:"))}}
	if _, _, _, err := sb.run(t, "id -u", root, nil); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Errorf("as root: %v", err)
	}
	if _, _, _, err := sb.run(t, "sudo -u root id", nil, nil); err != nil {
		t.Errorf("sudo -u root: %v", err)
	}
	req := connect.NewRequest(&ppb.StartRequest{Process: &ppb.ProcessConfig{Cmd: "sleep", Args: []string{"5"}}})
	req.Header().Set("Connect-Timeout-Ms", "500")
	stream, err := sb.procs.Start(context.Background(), req)
	if err == nil {
		for stream.Receive() {
		}
		err = stream.Err()
	}
	if connect.CodeOf(err) != connect.CodeDeadlineExceeded {
		t.Errorf("a stream past its timeout: %v", err)
	}
}

// e2bBackground: a background process is listed, followed again, fed,
// closed and killed.
func e2bBackground(t *testing.T, sb *e2bSandbox) {
	ctx := e2bCtx(t)
	stdin, tag := true, "catter"
	start, err := sb.procs.Start(ctx, connect.NewRequest(&ppb.StartRequest{Process: &ppb.ProcessConfig{Cmd: "cat"}, Stdin: &stdin, Tag: &tag}))
	if err != nil || !start.Receive() {
		t.Fatal(err, start.Err())
	}
	pid := start.Msg().GetEvent().GetStart().GetPid()
	start.Close()
	list, err := sb.procs.List(ctx, connect.NewRequest(&ppb.ListRequest{}))
	if err != nil || !slices.ContainsFunc(list.Msg.GetProcesses(), func(p *ppb.ProcessInfo) bool { return p.GetPid() == pid && p.GetTag() == tag }) {
		t.Fatalf("list: %v %v", list, err)
	}
	sel := &ppb.ProcessSelector{Selector: &ppb.ProcessSelector_Pid{Pid: pid}}
	conn, err := sb.procs.Connect(ctx, connect.NewRequest(&ppb.ConnectRequest{Process: sel}))
	if err != nil || !conn.Receive() || conn.Msg().GetEvent().GetStart().GetPid() != pid {
		t.Fatalf("connect: %v %v", err, conn.Err())
	}
	if _, err := sb.procs.SendInput(ctx, connect.NewRequest(&ppb.SendInputRequest{Process: sel,
		Input: &ppb.ProcessInput{Input: &ppb.ProcessInput_Stdin{Stdin: []byte("one ")}}})); err != nil {
		t.Fatal(err)
	}
	in := sb.procs.StreamInput(ctx)
	_ = in.Send(&ppb.StreamInputRequest{Event: &ppb.StreamInputRequest_Start{Start: &ppb.StreamInputRequest_StartEvent{Process: sel}}})
	_ = in.Send(&ppb.StreamInputRequest{Event: &ppb.StreamInputRequest_Data{Data: &ppb.StreamInputRequest_DataEvent{
		Input: &ppb.ProcessInput{Input: &ppb.ProcessInput_Stdin{Stdin: []byte("two")}}}}})
	if _, err := in.CloseAndReceive(); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.procs.CloseStdin(ctx, connect.NewRequest(&ppb.CloseStdinRequest{Process: sel})); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	for conn.Receive() {
		out.Write(conn.Msg().GetEvent().GetData().GetStdout())
		if end := conn.Msg().GetEvent().GetEnd(); end != nil {
			if out.String() != "one two" || end.GetExitCode() != 0 {
				t.Errorf("cat: %q %v", out.String(), end)
			}
			break
		}
	}
	// Killed by a signal: `kill -0` then finds it gone.
	start, err = sb.procs.Start(ctx, connect.NewRequest(&ppb.StartRequest{Process: &ppb.ProcessConfig{Cmd: "sleep", Args: []string{"60"}}}))
	if err != nil || !start.Receive() {
		t.Fatal(err)
	}
	pid = start.Msg().GetEvent().GetStart().GetPid()
	if _, err := sb.procs.SendSignal(ctx, connect.NewRequest(&ppb.SendSignalRequest{
		Process: &ppb.ProcessSelector{Selector: &ppb.ProcessSelector_Pid{Pid: pid}}, Signal: ppb.Signal_SIGNAL_SIGKILL})); err != nil {
		t.Fatal(err)
	}
	for start.Receive() {
		if end := start.Msg().GetEvent().GetEnd(); end != nil && (end.GetExited() || end.GetStatus() != "signal: killed") {
			t.Errorf("killed: %v", end)
		}
	}
	if _, _, end, _ := sb.run(t, fmt.Sprintf("kill -0 %d", pid), nil, nil); end.GetExitCode() == 0 {
		t.Error("the killed process is still there")
	}
	none, err := sb.procs.Connect(ctx, connect.NewRequest(&ppb.ConnectRequest{Process: &ppb.ProcessSelector{
		Selector: &ppb.ProcessSelector_Pid{Pid: 999999}}}))
	if err == nil {
		none.Receive()
		err = none.Err()
	}
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("connect to no process: %v", err)
	}
}

// e2bPTY: a terminal of a size, resized, echoing what it is sent.
func e2bPTY(t *testing.T, sb *e2bSandbox) {
	ctx := e2bCtx(t)
	start, err := sb.procs.Start(ctx, connect.NewRequest(&ppb.StartRequest{
		Process: &ppb.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-i", "-l"}, Envs: map[string]string{"TERM": "xterm-256color", "ABC": "123"}},
		Pty:     &ppb.PTY{Size: &ppb.PTY_Size{Cols: 80, Rows: 24}}}))
	if err != nil || !start.Receive() {
		t.Fatal(err, start.Err())
	}
	sel := &ppb.ProcessSelector{Selector: &ppb.ProcessSelector_Pid{Pid: start.Msg().GetEvent().GetStart().GetPid()}}
	if _, err := sb.procs.Update(ctx, connect.NewRequest(&ppb.UpdateRequest{Process: sel, Pty: &ppb.PTY{Size: &ppb.PTY_Size{Cols: 100, Rows: 24}}})); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.procs.SendInput(ctx, connect.NewRequest(&ppb.SendInputRequest{Process: sel,
		Input: &ppb.ProcessInput{Input: &ppb.ProcessInput_Pty{Pty: []byte("echo $ABC; tput cols; exit\n")}}})); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	for start.Receive() {
		out.Write(start.Msg().GetEvent().GetData().GetPty())
		if end := start.Msg().GetEvent().GetEnd(); end != nil {
			if end.GetExitCode() != 0 || !strings.Contains(out.String(), "123") || !strings.Contains(out.String(), "100") {
				t.Errorf("terminal: %q %v", out.String(), end)
			}
			return
		}
	}
	t.Fatal(start.Err())
}

// upload posts a body to the sandbox's /files.
func (b *e2bSandbox) upload(t *testing.T, query string, body io.Reader, length int64, hdr http.Header) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, b.s.url+"/e2b/files?"+query, body)
	req.ContentLength = length
	for k, v := range hdr {
		req.Header[k] = v
	}
	resp, err := b.http.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	got, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(got)
}

func (b *e2bSandbox) download(t *testing.T, query string) (int, string) {
	t.Helper()
	resp, err := b.http.Get(b.s.url + "/e2b/files?" + query)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	got, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(got)
}

// multipart is a multipart body of files, by name.
func (b *e2bSandbox) multipart(t *testing.T, files map[string]string) (*bytes.Buffer, string) {
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	for name, content := range files {
		w, _ := mw.CreateFormFile("file", name)
		_, _ = io.WriteString(w, content)
	}
	_ = mw.Close()
	return &buf, mw.FormDataContentType()
}

// e2bFiles: uploads (multipart, octet-stream, metadata) and downloads land
// in the conversation's folder, which its programs see as /data.
func e2bFiles(t *testing.T, sb *e2bSandbox) {
	body, ct := sb.multipart(t, map[string]string{"dir/a.txt": "alpha"})
	code, got := sb.upload(t, "", body, int64(body.Len()), http.Header{"Content-Type": {ct}, "X-Metadata-Author": {"mish"}})
	if code != http.StatusOK || !strings.Contains(got, `"path":"/home/user/dir/a.txt"`) || !strings.Contains(got, `"author":"mish"`) {
		t.Fatalf("multipart upload: %d %s", code, got)
	}
	code, _ = sb.upload(t, "path=b.bin", strings.NewReader("bravo"), 5, http.Header{"Content-Type": {"application/octet-stream"}})
	if code != http.StatusOK {
		t.Fatalf("octet-stream upload: %d", code)
	}
	if code, got := sb.download(t, "path=dir/a.txt"); code != http.StatusOK || got != "alpha" {
		t.Errorf("download: %d %q", code, got)
	}
	if code, _ := sb.download(t, "path=missing.txt"); code != http.StatusNotFound {
		t.Errorf("a missing file: %d", code)
	}
	if out := sb.mustRun(t, "cat /data/b.bin; stat -c %U:%G /home/user/b.bin"); out != "bravouser:user\n" {
		t.Errorf("the sandbox sees %q", out)
	}
}

// e2bFilesystem: the filesystem methods and the watchers.
func e2bFilesystem(t *testing.T, sb *e2bSandbox) {
	ctx := e2bCtx(t)
	if _, err := sb.fs.MakeDir(ctx, connect.NewRequest(&fspb.MakeDirRequest{Path: "w/sub"})); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.fs.MakeDir(ctx, connect.NewRequest(&fspb.MakeDirRequest{Path: "w/sub"})); connect.CodeOf(err) != connect.CodeAlreadyExists {
		t.Errorf("make_dir again: %v", err)
	}
	watcher, err := sb.fs.CreateWatcher(ctx, connect.NewRequest(&fspb.CreateWatcherRequest{Path: "w", Recursive: true}))
	if err != nil {
		t.Fatal(err)
	}
	stream, err := sb.fs.WatchDir(ctx, connect.NewRequest(&fspb.WatchDirRequest{Path: "/home/user/w"}))
	if err != nil || !stream.Receive() || stream.Msg().GetStart() == nil {
		t.Fatal(err, stream.Err())
	}
	if code, _ := sb.upload(t, "path=w/sub/f.txt", strings.NewReader("x"), 1, http.Header{"Content-Type": {"application/octet-stream"}}); code != http.StatusOK {
		t.Fatal(code)
	}
	if _, err := sb.fs.Move(ctx, connect.NewRequest(&fspb.MoveRequest{Source: "w/sub/f.txt", Destination: "w/g.txt"})); err != nil {
		t.Fatal(err)
	}
	st, err := sb.fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: "w/g.txt"}))
	if err != nil || st.Msg.GetEntry().GetPath() != "/home/user/w/g.txt" || st.Msg.GetEntry().GetOwner() != "user" ||
		st.Msg.GetEntry().GetPermissions() != "-rw-r--r--" {
		t.Errorf("stat: %v %v", st, err)
	}
	list, err := sb.fs.ListDir(ctx, connect.NewRequest(&fspb.ListDirRequest{Path: "w", Depth: 2}))
	if err != nil || len(list.Msg.GetEntries()) != 2 {
		t.Errorf("list: %v %v", list, err)
	}
	evs, err := sb.fs.GetWatcherEvents(ctx, connect.NewRequest(&fspb.GetWatcherEventsRequest{WatcherId: watcher.Msg.GetWatcherId()}))
	var names []string
	for _, e := range evs.Msg.GetEvents() {
		names = append(names, e.GetType().String()+" "+e.GetName())
	}
	if err != nil || strings.Join(names, ",") != "EVENT_TYPE_CREATE sub/f.txt,EVENT_TYPE_CHMOD sub/f.txt,EVENT_TYPE_WRITE sub/f.txt,"+
		"EVENT_TYPE_RENAME sub/f.txt,EVENT_TYPE_CREATE g.txt" {
		t.Errorf("watcher's events: %v %v", names, err)
	}
	if !stream.Receive() || stream.Msg().GetFilesystem().GetName() != "g.txt" {
		t.Errorf("streamed event: %v %v", stream.Msg(), stream.Err())
	}
	stream.Close()
	if _, err := sb.fs.RemoveWatcher(ctx, connect.NewRequest(&fspb.RemoveWatcherRequest{WatcherId: watcher.Msg.GetWatcherId()})); err != nil {
		t.Error(err)
	}
	if _, err := sb.fs.Remove(ctx, connect.NewRequest(&fspb.RemoveRequest{Path: "w"})); err != nil {
		t.Error(err)
	}
	if _, err := sb.fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: "w"})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("removed: %v", err)
	}
}

// execute runs code in the interpreter and returns its lines.
func (b *e2bSandbox) execute(t *testing.T, body map[string]any, token, header string) (int, []map[string]any) {
	t.Helper()
	j, _ := json.Marshal(body)
	req, _ := http.NewRequest(http.MethodPost, b.s.url+"/e2b/execute", bytes.NewReader(j))
	req.Header.Set("E2b-Sandbox-Id", b.id)
	req.Header.Set("E2b-Sandbox-Port", "49999")
	req.Header.Set(header, token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var lines []map[string]any
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil {
			lines = append(lines, m)
		}
	}
	return resp.StatusCode, lines
}

// e2bInterpreter: cells keep state, show results and name errors; a
// context is a namespace of its own.
func e2bInterpreter(t *testing.T, sb *e2bSandbox) {
	code, lines := sb.execute(t, map[string]any{"code": "x = 41\nprint('hi')\nx + 1"}, sb.access, "X-Access-Token")
	kinds := func(lines []map[string]any) string {
		var out []string
		for _, l := range lines {
			out = append(out, fmt.Sprintf("%v:%v%v", l["type"], l["text"], l["name"]))
		}
		return strings.Join(out, " ")
	}
	if code != http.StatusOK || kinds(lines) != "stdout:hi\n<nil> result:42<nil> number_of_executions:<nil><nil> end_of_execution:<nil><nil>" {
		t.Errorf("a cell: %d %q", code, kinds(lines))
	}
	if _, lines := sb.execute(t, map[string]any{"code": "x / 0"}, sb.traffic, "E2B-Traffic-Access-Token"); !strings.Contains(kinds(lines), "error:<nil>ZeroDivisionError") {
		t.Errorf("an error: %s", kinds(lines))
	}
	req, _ := http.NewRequest(http.MethodPost, sb.s.url+"/e2b/contexts", strings.NewReader(`{"language":"python"}`))
	req.Header.Set("E2b-Sandbox-Id", sb.id)
	req.Header.Set("E2b-Sandbox-Port", "49999")
	req.Header.Set("E2B-Traffic-Access-Token", sb.traffic)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var c struct{ ID string }
	_ = json.NewDecoder(resp.Body).Decode(&c)
	resp.Body.Close()
	if _, lines := sb.execute(t, map[string]any{"code": "x", "context_id": c.ID}, sb.access, "X-Access-Token"); !strings.Contains(kinds(lines), "NameError") {
		t.Errorf("another context sees the default's: %s", kinds(lines))
	}
	if code, _ := sb.execute(t, map[string]any{"code": "x"}, "forged", "X-Access-Token"); code != http.StatusUnauthorized {
		t.Errorf("a forged token: %d", code)
	}
	contexts := func(method, path string) (int, string) {
		req, _ := http.NewRequest(method, sb.s.url+"/e2b"+path, nil)
		req.Header.Set("E2b-Sandbox-Id", sb.id)
		req.Header.Set("E2b-Sandbox-Port", "49999")
		req.Header.Set("E2B-Traffic-Access-Token", sb.traffic)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := contexts(http.MethodGet, "/contexts"); code != http.StatusOK || !strings.Contains(body, c.ID) || !strings.Contains(body, `"javascript"`) {
		t.Errorf("contexts: %d %s", code, body)
	}
	sb.execute(t, map[string]any{"code": "y = 1", "context_id": c.ID}, sb.access, "X-Access-Token")
	if code, _ := contexts(http.MethodPost, "/contexts/"+c.ID+"/restart"); code != http.StatusOK {
		t.Errorf("restart: %d", code)
	}
	if _, lines := sb.execute(t, map[string]any{"code": "y", "context_id": c.ID}, sb.access, "X-Access-Token"); !strings.Contains(kinds(lines), "NameError") {
		t.Errorf("a restarted context kept its variables: %s", kinds(lines))
	}
	if code, _ := contexts(http.MethodDelete, "/contexts/"+c.ID); code != http.StatusOK {
		t.Errorf("remove: %d", code)
	}
	if code, _ := sb.execute(t, map[string]any{"code": "1", "context_id": c.ID}, sb.access, "X-Access-Token"); code != http.StatusNotFound {
		t.Errorf("a removed context: %d", code)
	}
}

// e2bAnotherClient: another client's sandbox is not found on the control
// plane, and is not listed.
func e2bAnotherClient(t *testing.T, s *service, alice, bob *e2bAPI, sb *e2bSandbox) {
	ctx := e2bCtx(t)
	if r, _ := bob.c.GetSandboxWithResponse(ctx, sb.id); r.StatusCode() != http.StatusNotFound {
		t.Errorf("bob gets alice's: %d", r.StatusCode())
	}
	if r, _ := bob.c.KillSandboxWithResponse(ctx, sb.id); r.StatusCode() != http.StatusNotFound {
		t.Errorf("bob kills alice's: %d", r.StatusCode())
	}
	if r, _ := bob.c.PauseSandboxWithResponse(ctx, sb.id, e2bclient.SandboxPauseRequest{}); r.StatusCode() != http.StatusNotFound {
		t.Errorf("bob pauses alice's: %d", r.StatusCode())
	}
	if r, _ := bob.c.ConnectSandboxWithResponse(ctx, sb.id, e2bclient.ConnectSandbox{Timeout: 600}); r.StatusCode() != http.StatusNotFound {
		t.Errorf("bob connects to alice's: %d", r.StatusCode())
	}
	if r, _ := bob.c.ListSandboxesWithResponse(ctx, nil); r.StatusCode() != http.StatusOK || len(*r.JSON200) != 0 {
		t.Errorf("bob lists: %d %v", r.StatusCode(), r.JSON200)
	}
	if r, _ := alice.c.GetSandboxWithResponse(ctx, sb.id); r.StatusCode() != http.StatusOK || r.JSON200.State != e2bclient.Running {
		t.Errorf("alice gets hers: %d", r.StatusCode())
	}
	req, _ := http.NewRequest(http.MethodGet, s.url+"/e2b/v2/sandboxes", nil)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("no API key: %v %v", resp, err)
	}
	// A page elsewhere, even with the key and a sandbox's token, is refused
	// by the origin check before anything else.
	req, _ = http.NewRequest(http.MethodGet, s.url+"/e2b/files?path=dir/a.txt", nil)
	req.Header.Set("Origin", "https://evil.example")
	req.Header.Set("X-API-Key", aliceToken)
	req.Header.Set("E2b-Sandbox-Id", sb.id)
	req.Header.Set("X-Access-Token", sb.access)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusForbidden {
		t.Errorf("from another origin: %v %v", resp, err)
	}
}

// e2bTokens: a sandbox call without the sandbox's own access token — none,
// forged, another sandbox's, the traffic token — is refused.
func e2bTokens(t *testing.T, s *service, bob *e2bAPI, sb *e2bSandbox) {
	other := bob.sandbox(s, "base", 60, nil)
	for name, tok := range map[string]string{"none": "", "forged": "forged-token", "another sandbox's": other.access, "its traffic token": sb.traffic} {
		forged := s.e2bSandbox(sb.id, tok, "", 49983)
		if _, _, _, err := forged.run(t, "id", nil, nil); connect.CodeOf(err) != connect.CodeUnauthenticated {
			t.Errorf("%s: %v", name, err)
		}
		if code, _ := forged.download(t, "path=/etc/hostname"); code != http.StatusUnauthorized {
			t.Errorf("%s /files: %d", name, code)
		}
	}
	// Its own token on another sandbox's id does not open it either.
	if _, _, _, err := s.e2bSandbox(other.id, sb.access, "", 49983).run(t, "id", nil, nil); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Errorf("a token on another sandbox: %v", err)
	}
	if _, _, _, err := s.e2bSandbox("nosuchsandboxxxxxxxx", sb.access, "", 49983).run(t, "id", nil, nil); connect.CodeOf(err) != connect.CodeUnavailable {
		t.Errorf("no such sandbox: %v", err)
	}
}

// host reaches a sandbox's port by its host, <port>-<id>.localhost:<port
// of the api>, through the api's address.
func (s *service) host(t *testing.T, port int, id, path string, hdr http.Header) (int, string) {
	t.Helper()
	u, _ := url.Parse(s.url)
	return s.browse(t, fmt.Sprintf("http://%d-%s.localhost:%s%s", port, id, u.Port(), path), hdr)
}

// e2bPorts: by header only the daemon and the interpreter are reached; by
// host a program's port is, but never the agent's egress proxy; signed
// /files URLs work by host.
func e2bPorts(t *testing.T, s *service, sb *e2bSandbox) {
	for _, port := range []int{8000, 3128, 22} {
		if code, _ := s.e2bSandbox(sb.id, sb.access, "", port).download(t, "path=x"); code != http.StatusForbidden {
			t.Errorf("port %d by header: %d", port, code)
		}
	}
	if code, _ := s.host(t, 3128, sb.id, "/", nil); code != http.StatusForbidden {
		t.Errorf("the egress proxy's port by host: %d", code)
	}
	start, err := sb.procs.Start(e2bCtx(t), connect.NewRequest(&ppb.StartRequest{Process: &ppb.ProcessConfig{
		Cmd: "python3", Args: []string{"-m", "http.server", "8000", "--bind", "127.0.0.1"}, Cwd: proto.String("/home/user/dir")}}))
	if err != nil || !start.Receive() {
		t.Fatal(err)
	}
	defer start.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		code, body := s.host(t, 8000, sb.id, "/a.txt", nil)
		if code == http.StatusOK && body == "alpha" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a program's port by host: %d %q", code, body)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if code, body := s.host(t, 49983, sb.id, "/files?path=dir/a.txt", http.Header{"X-Access-Token": {sb.access}}); code != http.StatusOK || body != "alpha" {
		t.Errorf("the daemon by host: %d %q", code, body)
	}
	sig := func(exp string) string {
		raw := "dir/a.txt:read:user:" + sb.access
		if exp != "" {
			raw += ":" + exp
		}
		sum := sha256.Sum256([]byte(raw))
		return "v1_" + base64.RawStdEncoding.EncodeToString(sum[:])
	}
	future, past := fmt.Sprint(time.Now().Add(time.Minute).Unix()), fmt.Sprint(time.Now().Add(-time.Minute).Unix())
	if code, body := s.host(t, 49983, sb.id, "/files?path=dir/a.txt&username=user&signature="+url.QueryEscape(sig(future))+"&signature_expiration="+future, nil); code != http.StatusOK || body != "alpha" {
		t.Errorf("a signed URL: %d %q", code, body)
	}
	if code, body := s.host(t, 49983, sb.id, "/files?path=dir/a.txt&username=user&signature="+url.QueryEscape(sig(past))+"&signature_expiration="+past, nil); code != http.StatusUnauthorized || !strings.Contains(body, "signature is already expired") {
		t.Errorf("an expired signed URL: %d %q", code, body)
	}
	if code, _ := s.host(t, 49983, sb.id, "/files?path=dir/b.txt&username=user&signature="+url.QueryEscape(sig("")), nil); code != http.StatusUnauthorized {
		t.Errorf("a signature for another path: %d", code)
	}
}

// e2bBodies: an upload past the bound is refused, whether it says its
// length or not; the sandbox and the api go on.
func e2bBodies(t *testing.T, s *service, sb *e2bSandbox) {
	oct := http.Header{"Content-Type": {"application/octet-stream"}}
	if code, _ := sb.upload(t, "path=big.bin", &zeros{left: 90 << 20}, 90<<20, oct); code != http.StatusRequestEntityTooLarge && code != 0 {
		t.Errorf("a declared 90 MB body: %d", code)
	}
	pr, pw := io.Pipe()
	go func() {
		mw := multipart.NewWriter(pw)
		w, _ := mw.CreateFormFile("file", "huge.bin")
		_, _ = io.Copy(w, &zeros{left: 3 * e2bUploadLimit})
		_ = mw.Close()
		pw.Close()
	}()
	if code, _ := sb.upload(t, "", pr, -1, http.Header{"Content-Type": {"multipart/form-data; boundary=x"}}); code == http.StatusOK {
		t.Errorf("a chunked multipart body past the bound was taken")
	}
	pr.Close()
	if code, _ := sb.upload(t, "path=fits.bin", &zeros{left: e2bUploadLimit - 1}, -1, oct); code != http.StatusOK {
		t.Errorf("a body within the bound: %d", code)
	}
	if out := sb.mustRun(t, "stat -c %s fits.bin"); out != fmt.Sprintf("%d\n", e2bUploadLimit-1) {
		t.Errorf("written: %q", out)
	}
}

// e2bTraversal: paths resolve inside the sandbox: "..", absolute paths and
// links reach the sandbox's own files, never the host's or another
// conversation's.
func e2bTraversal(t *testing.T, s *service, alice *e2bAPI, sb *e2bSandbox) {
	other := alice.sandbox(s, "base", 60, nil)
	if code, _ := other.upload(t, "path=secret.txt", strings.NewReader("other's secret"), 14, http.Header{"Content-Type": {"application/octet-stream"}}); code != http.StatusOK {
		t.Fatal(code)
	}
	hostFile := filepath.Join(s.root, "host-only.txt")
	if err := os.WriteFile(hostFile, []byte("host secret"), 0o644); err != nil {
		t.Fatal(err)
	}
	key := "~alice~" + other.id
	for _, p := range []string{
		"../../../../" + hostFile, hostFile, "/data/../" + key + "/files/secret.txt", "../" + key + "/secret.txt",
		"../../" + filepath.Base(s.root) + "/" + key + "/files/secret.txt", "/proc/1/root/" + hostFile,
	} {
		if code, got := sb.download(t, "path="+url.QueryEscape(p)); code == http.StatusOK || strings.Contains(got, "other's secret") || strings.Contains(got, "host secret") {
			t.Errorf("%s: %d %q", p, code, got)
		}
	}
	sb.mustRun(t, "ln -sf /etc/shadow shadow-link; ln -sfn / root-link")
	if code, got := sb.download(t, "path=shadow-link"); code != http.StatusForbidden || strings.Contains(got, "root:") {
		t.Errorf("a link to /etc/shadow: %d %q", code, got)
	}
	list, err := sb.fs.ListDir(e2bCtx(t), connect.NewRequest(&fspb.ListDirRequest{Path: "root-link/../../.."}))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range list.Msg.GetEntries() {
		if e.GetName() == filepath.Base(s.root) || e.GetName() == "host-only.txt" {
			t.Errorf("the host's %s listed", e.GetName())
		}
	}
	if _, err := sb.fs.Stat(e2bCtx(t), connect.NewRequest(&fspb.StatRequest{Path: "a\x00b"})); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("a NUL: %v", err)
	}
	if code, _ := sb.download(t, "path=a%00b"); code != http.StatusBadRequest {
		t.Errorf("a NUL in /files: %d", code)
	}
}

// e2bFlood: a terminal flooding its output to a client that does not
// read is held back: the api's memory stays put and the sandbox answers.
func e2bFlood(t *testing.T, s *service, sb *e2bSandbox) {
	var api *proc
	for _, p := range s.procs {
		if p.name == "api" {
			api = p
		}
	}
	before := rss(t, api.cmd.Process.Pid)
	msg, _ := proto.Marshal(&ppb.StartRequest{Process: &ppb.ProcessConfig{Cmd: "yes", Args: []string{strings.Repeat("flood", 100)}},
		Pty: &ppb.PTY{Size: &ppb.PTY_Size{Cols: 80, Rows: 24}}})
	dialer := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
	}}
	c, err := dialer.Dial("tcp", strings.TrimPrefix(s.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "POST /e2b/process.Process/Start HTTP/1.1\r\nHost: api\r\nE2b-Sandbox-Id: %s\r\nE2b-Sandbox-Port: 49983\r\n"+
		"X-Access-Token: %s\r\nContent-Type: application/connect+proto\r\nConnect-Protocol-Version: 1\r\nContent-Length: %d\r\n\r\n\x00%s%s",
		sb.id, sb.access, 5+len(msg), binary.BigEndian.AppendUint32(nil, uint32(len(msg))), msg)
	time.Sleep(3 * time.Second) // the flood runs; the client reads nothing
	began := time.Now()
	if out := sb.mustRun(t, "echo still here"); out != "still here\n" || time.Since(began) > 5*time.Second {
		t.Errorf("the sandbox during a flood: %q in %v", out, time.Since(began))
	}
	if growth := rss(t, api.cmd.Process.Pid) - before; growth > 32<<20 {
		t.Errorf("the api's memory grew by %d MB during a flood nobody read", growth>>20)
	}
	list, err := sb.procs.List(e2bCtx(t), connect.NewRequest(&ppb.ListRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range list.Msg.GetProcesses() {
		if p.GetConfig().GetCmd() == "yes" {
			_, _ = sb.procs.SendSignal(e2bCtx(t), connect.NewRequest(&ppb.SendSignalRequest{
				Process: &ppb.ProcessSelector{Selector: &ppb.ProcessSelector_Pid{Pid: p.GetPid()}}, Signal: ppb.Signal_SIGNAL_SIGKILL}))
		}
	}
}

// e2bTimeouts: a sandbox whose timeout came is killed (not found, its
// calls 502), or paused with autoPause.
func e2bTimeouts(t *testing.T, alice *e2bAPI, short *e2bSandbox, paused string) {
	ctx := e2bCtx(t)
	deadline := time.Now().Add(20 * time.Second)
	for {
		r, _ := alice.c.GetSandboxWithResponse(ctx, short.id)
		p, _ := alice.c.GetSandboxWithResponse(ctx, paused)
		if r.StatusCode() == http.StatusNotFound && p.StatusCode() == http.StatusOK && p.JSON200.State == e2bclient.Paused {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after their timeout: %d, %d %+v", r.StatusCode(), p.StatusCode(), p.JSON200)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if _, _, _, err := short.run(t, "id", nil, nil); connect.CodeOf(err) != connect.CodeUnavailable {
		t.Errorf("a call to a killed sandbox: %v", err)
	}
}

// e2bAutoResume: a paused sandbox that asked to be resumed by traffic is,
// by the next call to it.
func e2bAutoResume(t *testing.T, s *service, alice *e2bAPI) {
	yes, timeout := true, int32(60)
	created, code := alice.create(e2bclient.NewSandbox{TemplateID: "base", Timeout: &timeout, AutoPause: &yes,
		AutoResume: &e2bclient.SandboxAutoResumeConfig{Enabled: true}})
	if code != http.StatusCreated {
		t.Fatalf("create: %d", code)
	}
	ctx := e2bCtx(t)
	if p, _ := alice.c.PauseSandboxWithResponse(ctx, created.SandboxID, e2bclient.SandboxPauseRequest{}); p.StatusCode() != http.StatusNoContent {
		t.Fatalf("pause: %d", p.StatusCode())
	}
	sb := s.e2bSandbox(created.SandboxID, *created.EnvdAccessToken, "", 49983)
	if out := sb.mustRun(t, "echo resumed"); out != "resumed\n" {
		t.Errorf("a call to a paused sandbox with autoResume: %q", out)
	}
	if g, _ := alice.c.GetSandboxWithResponse(ctx, created.SandboxID); g.StatusCode() != http.StatusOK || g.JSON200.State != e2bclient.Running {
		t.Errorf("after the call: %d", g.StatusCode())
	}
}

// e2bLifecycle: listing with filters and pages, timeouts and refreshes,
// metrics, pause and connect (its files kept), kill.
func e2bLifecycle(t *testing.T, alice *e2bAPI, sb *e2bSandbox) {
	ctx := e2bCtx(t)
	md := e2bclient.Metadata("suite=e2b")
	running := []e2bclient.SandboxState{e2bclient.Running}
	if r, _ := alice.c.ListSandboxesWithResponse(ctx, &e2bclient.ListSandboxesParams{Metadata: &md, State: &running}); r.StatusCode() != http.StatusOK ||
		len(*r.JSON200) != 1 || (*r.JSON200)[0].SandboxID != sb.id {
		t.Errorf("list by metadata: %d %v", r.StatusCode(), r.JSON200)
	}
	one := int32(1)
	r, _ := alice.c.ListSandboxesWithResponse(ctx, &e2bclient.ListSandboxesParams{Limit: &one})
	if next := r.HTTPResponse.Header.Get("X-Next-Token"); r.StatusCode() != http.StatusOK || len(*r.JSON200) != 1 || next == "" {
		t.Errorf("a page of one: %d %v next %q", r.StatusCode(), r.JSON200, next)
	}
	before, _ := alice.c.GetSandboxWithResponse(ctx, sb.id)
	if c, _ := alice.c.ConnectSandboxWithResponse(ctx, sb.id, e2bclient.ConnectSandbox{Timeout: 10}); c.StatusCode() != http.StatusOK {
		t.Errorf("connect to a running sandbox: %d", c.StatusCode())
	}
	if after, _ := alice.c.GetSandboxWithResponse(ctx, sb.id); !after.JSON200.EndAt.Equal(before.JSON200.EndAt) {
		t.Errorf("connect shortened the timeout: %v → %v", before.JSON200.EndAt, after.JSON200.EndAt)
	}
	if c, _ := alice.c.SetSandboxTimeoutWithResponse(ctx, sb.id, e2bclient.SetSandboxTimeoutJSONRequestBody{Timeout: 900}); c.StatusCode() != http.StatusNoContent {
		t.Errorf("set timeout: %d", c.StatusCode())
	}
	d := 600
	if c, _ := alice.c.RefreshSandboxWithResponse(ctx, sb.id, e2bclient.RefreshSandboxJSONRequestBody{Duration: &d}); c.StatusCode() != http.StatusNoContent {
		t.Errorf("refresh: %d", c.StatusCode())
	}
	if after, _ := alice.c.GetSandboxWithResponse(ctx, sb.id); after.JSON200.EndAt.Sub(time.Now()) < 800*time.Second {
		t.Errorf("timeout not set: %v", after.JSON200.EndAt)
	}
	if m, _ := alice.c.GetSandboxMetricsWithResponse(ctx, sb.id); m.StatusCode() != http.StatusOK || len(*m.JSON200) != 1 ||
		(*m.JSON200)[0].MemUsed <= 0 || (*m.JSON200)[0].DiskTotal <= 0 {
		t.Errorf("metrics: %d %v", m.StatusCode(), m.JSON200)
	}
	if m, _ := alice.c.GetSandboxesMetricsWithResponse(ctx, &e2bclient.GetSandboxesMetricsParams{SandboxIds: []string{sb.id, "nosuchsandboxxxxxxxx"}}); m.StatusCode() != http.StatusOK ||
		len(m.JSON200.Sandboxes) != 1 || m.JSON200.Sandboxes[sb.id].MemTotal <= 0 {
		t.Errorf("metrics of many: %d %v", m.StatusCode(), m.JSON200)
	}
	if r, _ := alice.c.ListRunningSandboxesWithResponse(ctx, &e2bclient.ListRunningSandboxesParams{Metadata: &md}); r.StatusCode() != http.StatusOK ||
		len(*r.JSON200) != 1 || (*r.JSON200)[0].SandboxID != sb.id {
		t.Errorf("the running ones: %d %v", r.StatusCode(), r.JSON200)
	}
	if r, _ := alice.c.ResumeSandboxWithResponse(ctx, sb.id, e2bclient.ResumedSandbox{}); r.StatusCode() != http.StatusConflict {
		t.Errorf("resume a running sandbox: %d", r.StatusCode())
	}
	if resp, err := sb.http.Get(sb.s.url + "/e2b/health"); err != nil || resp.StatusCode != http.StatusNoContent {
		t.Errorf("the daemon's health: %v %v", resp, err)
	}
	if p, _ := alice.c.PauseSandboxWithResponse(ctx, sb.id, e2bclient.SandboxPauseRequest{}); p.StatusCode() != http.StatusNoContent {
		t.Fatalf("pause: %d", p.StatusCode())
	}
	if p, _ := alice.c.PauseSandboxWithResponse(ctx, sb.id, e2bclient.SandboxPauseRequest{}); p.StatusCode() != http.StatusConflict {
		t.Errorf("pause again: %d", p.StatusCode())
	}
	if _, _, _, err := sb.run(t, "id", nil, nil); connect.CodeOf(err) != connect.CodeUnavailable {
		t.Errorf("a call to a paused sandbox: %v", err)
	}
	sixty := int32(60)
	if c, _ := alice.c.ResumeSandboxWithResponse(ctx, sb.id, e2bclient.ResumedSandbox{Timeout: &sixty}); c.StatusCode() != http.StatusCreated {
		t.Fatalf("resume a paused sandbox: %d", c.StatusCode())
	}
	if p, _ := alice.c.PauseSandboxWithResponse(ctx, sb.id, e2bclient.SandboxPauseRequest{}); p.StatusCode() != http.StatusNoContent {
		t.Fatalf("pause again: %d", p.StatusCode())
	}
	if c, _ := alice.c.ConnectSandboxWithResponse(ctx, sb.id, e2bclient.ConnectSandbox{Timeout: 60}); c.StatusCode() != http.StatusCreated {
		t.Fatalf("connect to a paused sandbox: %d", c.StatusCode())
	}
	if out := sb.mustRun(t, "cat dir/a.txt"); out != "alpha" {
		t.Errorf("files after a resume: %q", out)
	}
	if k, _ := alice.c.KillSandboxWithResponse(ctx, sb.id); k.StatusCode() != http.StatusNoContent {
		t.Errorf("kill: %d", k.StatusCode())
	}
	if g, _ := alice.c.GetSandboxWithResponse(ctx, sb.id); g.StatusCode() != http.StatusNotFound {
		t.Errorf("get after kill: %d", g.StatusCode())
	}
	if k, _ := alice.c.KillSandboxWithResponse(ctx, sb.id); k.StatusCode() != http.StatusNotFound {
		t.Errorf("kill again: %d", k.StatusCode())
	}
}
