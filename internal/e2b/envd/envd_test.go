package envd

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	fspb "github.com/runbox-dev/runbox/internal/e2b/envdpb/filesystem"
	"github.com/runbox-dev/runbox/internal/e2b/envdpb/filesystem/filesystempbconnect"
	ppb "github.com/runbox-dev/runbox/internal/e2b/envdpb/process"
	"github.com/runbox-dev/runbox/internal/e2b/envdpb/process/processpbconnect"
)

// daemon is a daemon serving on a test server, its home a link to a
// folder as in a sandbox.
type daemon struct {
	srv   *Server
	url   string
	home  string
	data  string
	procs processpbconnect.ProcessClient
	fs    filesystempbconnect.FilesystemClient
}

func newDaemon(t *testing.T, limits Limits) *daemon {
	t.Helper()
	dir := t.TempDir()
	data, home := filepath.Join(dir, "data"), filepath.Join(dir, "home")
	if err := os.Mkdir(data, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(data, home); err != nil {
		t.Fatal(err)
	}
	srv := New(Config{Home: home, Data: data, User: "user", Limits: limits,
		Env: []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + home, "LANG=C.UTF-8"}})
	ts := httptest.NewServer(srv)
	t.Cleanup(func() { ts.Close(); srv.Close() })
	return &daemon{srv: srv, url: ts.URL, home: home, data: data,
		procs: processpbconnect.NewProcessClient(ts.Client(), ts.URL, connect.WithProtoJSON()),
		fs:    filesystempbconnect.NewFilesystemClient(ts.Client(), ts.URL)}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// run starts a command as the SDK does (bash -l -c) and follows it to
// its end.
func (d *daemon) run(t *testing.T, command string, envs map[string]string, cwd *string) (out, errOut string, end *ppb.ProcessEvent_EndEvent) {
	t.Helper()
	stream, err := d.procs.Start(ctxT(t), connect.NewRequest(&ppb.StartRequest{
		Process: &ppb.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-c", command}, Envs: envs, Cwd: cwd}}))
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	var o, e strings.Builder
	for stream.Receive() {
		switch ev := stream.Msg().GetEvent().GetEvent().(type) {
		case *ppb.ProcessEvent_Data:
			o.Write(ev.Data.GetStdout())
			e.Write(ev.Data.GetStderr())
		case *ppb.ProcessEvent_End:
			return o.String(), e.String(), ev.End
		}
	}
	t.Fatalf("stream ended without an end: %v", stream.Err())
	return
}

// TestProcessRun: a command's output, exit code, environment and working
// directory, as the SDK's commands.run sees them.
func TestProcessRun(t *testing.T) {
	d := newDaemon(t, Limits{})
	sub := "sub"
	if err := os.Mkdir(filepath.Join(d.data, sub), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, cmd   string
		envs        map[string]string
		cwd         *string
		out, errOut string
		code        int32
		exited      bool
	}{
		{name: "echo", cmd: `echo "Hello, World!"`, out: "Hello, World!\n", exited: true},
		{name: "stderr and exit code", cmd: "echo oops >&2; exit 3", errOut: "oops\n", code: 3, exited: true},
		{name: "envs", cmd: "echo $FOO", envs: map[string]string{"FOO": "bar"}, out: "bar\n", exited: true},
		{name: "home is the default directory", cmd: "pwd", out: d.home + "\n", exited: true},
		{name: "relative cwd", cmd: "pwd", cwd: &sub, out: d.home + "/sub\n", exited: true},
		{name: "killed", cmd: "kill -9 $$", code: -1},
	} {
		t.Run(c.name, func(t *testing.T) {
			out, errOut, end := d.run(t, c.cmd, c.envs, c.cwd)
			if out != c.out || errOut != c.errOut || end.GetExitCode() != c.code || end.GetExited() != c.exited {
				t.Errorf("got %q %q %v; want %q %q exit %d exited %v", out, errOut, end, c.out, c.errOut, c.code, c.exited)
			}
		})
	}
}

// TestProcessBackground: a process started in the background is listed,
// followed again by pid, fed its input, and killed by a signal.
func TestProcessBackground(t *testing.T) {
	d := newDaemon(t, Limits{})
	ctx := ctxT(t)
	tag := "cat"
	stdin := true
	start, err := d.procs.Start(ctx, connect.NewRequest(&ppb.StartRequest{
		Process: &ppb.ProcessConfig{Cmd: "cat"}, Tag: &tag, Stdin: &stdin}))
	if err != nil {
		t.Fatal(err)
	}
	if !start.Receive() {
		t.Fatal(start.Err())
	}
	pid := start.Msg().GetEvent().GetStart().GetPid()
	start.Close() // the client goes; the process runs on

	list, err := d.procs.List(ctx, connect.NewRequest(&ppb.ListRequest{}))
	if err != nil || len(list.Msg.GetProcesses()) != 1 || list.Msg.GetProcesses()[0].GetPid() != pid || list.Msg.GetProcesses()[0].GetTag() != tag {
		t.Fatalf("list: %v %v", list, err)
	}
	conn, err := d.procs.Connect(ctx, connect.NewRequest(&ppb.ConnectRequest{Process: &ppb.ProcessSelector{Selector: &ppb.ProcessSelector_Tag{Tag: tag}}}))
	if err != nil || !conn.Receive() || conn.Msg().GetEvent().GetStart().GetPid() != pid {
		t.Fatalf("connect: %v %v", err, conn.Err())
	}
	sel := &ppb.ProcessSelector{Selector: &ppb.ProcessSelector_Pid{Pid: pid}}
	if _, err := d.procs.SendInput(ctx, connect.NewRequest(&ppb.SendInputRequest{Process: sel,
		Input: &ppb.ProcessInput{Input: &ppb.ProcessInput_Stdin{Stdin: []byte("Hello, World!")}}})); err != nil {
		t.Fatal(err)
	}
	if !conn.Receive() || string(conn.Msg().GetEvent().GetData().GetStdout()) != "Hello, World!" {
		t.Fatalf("echoed: %v %v", conn.Msg(), conn.Err())
	}
	if _, err := d.procs.SendSignal(ctx, connect.NewRequest(&ppb.SendSignalRequest{Process: sel, Signal: ppb.Signal_SIGNAL_SIGKILL})); err != nil {
		t.Fatal(err)
	}
	for conn.Receive() {
		if end := conn.Msg().GetEvent().GetEnd(); end != nil {
			if end.GetExited() || end.GetStatus() != "signal: killed" {
				t.Errorf("end: %v", end)
			}
			break
		}
	}
	_, err = d.procs.Connect(ctx, connect.NewRequest(&ppb.ConnectRequest{Process: sel}))
	if err == nil {
		_, err = d.procs.SendSignal(ctx, connect.NewRequest(&ppb.SendSignalRequest{Process: sel, Signal: ppb.Signal_SIGNAL_SIGKILL}))
	}
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("an ended process: %v, want not_found", err)
	}
}

// TestProcessCloseStdin: closing a process's input ends cat.
func TestProcessCloseStdin(t *testing.T) {
	d := newDaemon(t, Limits{})
	ctx := ctxT(t)
	stdin := true
	start, err := d.procs.Start(ctx, connect.NewRequest(&ppb.StartRequest{Process: &ppb.ProcessConfig{Cmd: "cat"}, Stdin: &stdin}))
	if err != nil || !start.Receive() {
		t.Fatal(err, start.Err())
	}
	sel := &ppb.ProcessSelector{Selector: &ppb.ProcessSelector_Pid{Pid: start.Msg().GetEvent().GetStart().GetPid()}}
	stream := d.procs.StreamInput(ctx)
	_ = stream.Send(&ppb.StreamInputRequest{Event: &ppb.StreamInputRequest_Start{Start: &ppb.StreamInputRequest_StartEvent{Process: sel}}})
	_ = stream.Send(&ppb.StreamInputRequest{Event: &ppb.StreamInputRequest_Data{Data: &ppb.StreamInputRequest_DataEvent{
		Input: &ppb.ProcessInput{Input: &ppb.ProcessInput_Stdin{Stdin: []byte("streamed")}}}}})
	if _, err := stream.CloseAndReceive(); err != nil {
		t.Fatal(err)
	}
	if _, err := d.procs.CloseStdin(ctx, connect.NewRequest(&ppb.CloseStdinRequest{Process: sel})); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	for start.Receive() {
		out.Write(start.Msg().GetEvent().GetData().GetStdout())
		if end := start.Msg().GetEvent().GetEnd(); end != nil {
			if end.GetExitCode() != 0 || out.String() != "streamed" {
				t.Errorf("got %q, end %v", out.String(), end)
			}
			return
		}
	}
	t.Fatal(start.Err())
}

// TestPTY: a terminal echoes what it is sent, has the size asked for,
// and takes a new one.
func TestPTY(t *testing.T) {
	d := newDaemon(t, Limits{})
	ctx := ctxT(t)
	start, err := d.procs.Start(ctx, connect.NewRequest(&ppb.StartRequest{
		Process: &ppb.ProcessConfig{Cmd: "/bin/bash", Args: []string{"--norc", "--noprofile", "-i"}, Envs: map[string]string{"TERM": "xterm", "ABC": "123"}},
		Pty:     &ppb.PTY{Size: &ppb.PTY_Size{Cols: 80, Rows: 24}}}))
	if err != nil || !start.Receive() {
		t.Fatal(err, start.Err())
	}
	sel := &ppb.ProcessSelector{Selector: &ppb.ProcessSelector_Pid{Pid: start.Msg().GetEvent().GetStart().GetPid()}}
	if _, err := d.procs.Update(ctx, connect.NewRequest(&ppb.UpdateRequest{Process: sel, Pty: &ppb.PTY{Size: &ppb.PTY_Size{Cols: 100, Rows: 30}}})); err != nil {
		t.Fatal(err)
	}
	if _, err := d.procs.SendInput(ctx, connect.NewRequest(&ppb.SendInputRequest{Process: sel,
		Input: &ppb.ProcessInput{Input: &ppb.ProcessInput_Pty{Pty: []byte("echo $ABC; stty size; exit\n")}}})); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	for start.Receive() {
		out.Write(start.Msg().GetEvent().GetData().GetPty())
		if end := start.Msg().GetEvent().GetEnd(); end != nil {
			if end.GetExitCode() != 0 || !strings.Contains(out.String(), "123") || !strings.Contains(out.String(), "30 100") {
				t.Errorf("terminal said %q, end %v", out.String(), end)
			}
			return
		}
	}
	t.Fatal(start.Err())
}

// TestPTYFlood: a terminal that floods its output is held back for a
// client that does not read, which is cut off once it stalls past the
// bound: the daemon holds a few chunks for it, never the flood. (The
// client is a bare socket: Go's HTTP client reads ahead of its reader.)
func TestPTYFlood(t *testing.T) {
	d := newDaemon(t, Limits{Processes: 8, Watchers: 8, WatcherEvents: 100, Stall: 500 * time.Millisecond})
	msg, err := proto.Marshal(&ppb.StartRequest{Process: &ppb.ProcessConfig{Cmd: "yes", Args: []string{strings.Repeat("flood", 100)}},
		Pty: &ppb.PTY{Size: &ppb.PTY_Size{Cols: 80, Rows: 24}}})
	if err != nil {
		t.Fatal(err)
	}
	// A small receive buffer, set before the connection's window is.
	dialer := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
	}}
	c, err := dialer.Dial("tcp", strings.TrimPrefix(d.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = fmt.Fprintf(c, "POST /process.Process/Start HTTP/1.1\r\nHost: envd\r\nContent-Type: application/connect+proto\r\n"+
		"Connect-Protocol-Version: 1\r\nContent-Length: %d\r\n\r\n\x00%s%s", 5+len(msg), binary.BigEndian.AppendUint32(nil, uint32(len(msg))), msg)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second) // the client reads nothing
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	// The stream ends with the daemon's word, after the daemon's queue and
	// the sockets' buffers, not 3 s of a flood.
	var got []byte
	buf := make([]byte, 64<<10)
	for !bytes.Contains(got, []byte(`"code":"resource_exhausted"`)) {
		n, err := c.Read(buf)
		got = append(got, buf[:n]...)
		if err != nil {
			t.Fatalf("the stream did not end with resource_exhausted: %v after %d bytes: ...%q", err, len(got), got[max(0, len(got)-200):])
		}
	}
	if len(got) > 8<<20 {
		t.Errorf("the stalled client was sent %d bytes", len(got))
	}
	t.Logf("a client stalled for 3 s got %d bytes before it was cut off", len(got))
	for _, p := range d.srv.procs.list() {
		_, _ = d.procs.SendSignal(ctxT(t), connect.NewRequest(&ppb.SendSignalRequest{
			Process: &ppb.ProcessSelector{Selector: &ppb.ProcessSelector_Pid{Pid: p.GetPid()}}, Signal: ppb.Signal_SIGNAL_SIGKILL}))
	}
}

// TestUsers: the sandbox's user, or none, is accepted; root is refused,
// as is anyone else.
func TestUsers(t *testing.T) {
	d := newDaemon(t, Limits{})
	for _, c := range []struct {
		user string
		code connect.Code
	}{{"", 0}, {"user", 0}, {"root", connect.CodePermissionDenied}, {"bob", connect.CodeInvalidArgument}} {
		req := connect.NewRequest(&ppb.StartRequest{Process: &ppb.ProcessConfig{Cmd: "true"}})
		if c.user != "" {
			req.Header().Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(c.user+":")))
		}
		stream, err := d.procs.Start(ctxT(t), req)
		if err == nil {
			for stream.Receive() {
			}
			err = stream.Err()
		}
		if connect.CodeOf(err) != c.code && !(c.code == 0 && err == nil) {
			t.Errorf("user %q: %v, want %v", c.user, err, c.code)
		}
	}
}

// TestFilesystem: the filesystem methods, paths shown under the home.
func TestFilesystem(t *testing.T) {
	d := newDaemon(t, Limits{})
	ctx := ctxT(t)
	made, err := d.fs.MakeDir(ctx, connect.NewRequest(&fspb.MakeDirRequest{Path: "a/b"}))
	if err != nil || made.Msg.GetEntry().GetPath() != d.home+"/a/b" || made.Msg.GetEntry().GetType() != fspb.FileType_FILE_TYPE_DIRECTORY {
		t.Fatalf("make_dir: %v %v", made, err)
	}
	if _, err := d.fs.MakeDir(ctx, connect.NewRequest(&fspb.MakeDirRequest{Path: "a/b"})); connect.CodeOf(err) != connect.CodeAlreadyExists {
		t.Errorf("make_dir again: %v", err)
	}
	if err := os.WriteFile(filepath.Join(d.data, "a", "f.txt"), []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("f.txt", filepath.Join(d.data, "a", "link")); err != nil {
		t.Fatal(err)
	}
	list, err := d.fs.ListDir(ctx, connect.NewRequest(&fspb.ListDirRequest{Path: "a", Depth: 2}))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range list.Msg.GetEntries() {
		got = append(got, strings.TrimPrefix(e.GetPath(), d.home))
	}
	if strings.Join(got, " ") != "/a/b /a/f.txt /a/link" {
		t.Errorf("list: %v", got)
	}
	st, err := d.fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: d.data + "/a/link"}))
	if err != nil || st.Msg.GetEntry().GetSymlinkTarget() != d.home+"/a/f.txt" || st.Msg.GetEntry().GetSize() != 5 ||
		st.Msg.GetEntry().GetPath() != d.home+"/a/link" || st.Msg.GetEntry().GetType() != fspb.FileType_FILE_TYPE_FILE {
		t.Errorf("stat of a link: %v %v", st, err)
	}
	moved, err := d.fs.Move(ctx, connect.NewRequest(&fspb.MoveRequest{Source: "a/f.txt", Destination: "c/g.txt"}))
	if err != nil || moved.Msg.GetEntry().GetPath() != d.home+"/c/g.txt" {
		t.Errorf("move: %v %v", moved, err)
	}
	if _, err := d.fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: "a/f.txt"})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("stat of the moved file: %v", err)
	}
	if _, err := d.fs.Remove(ctx, connect.NewRequest(&fspb.RemoveRequest{Path: "a"})); err != nil {
		t.Fatal(err)
	}
	if _, err := d.fs.Remove(ctx, connect.NewRequest(&fspb.RemoveRequest{Path: "a"})); err != nil {
		t.Errorf("remove of nothing: %v", err)
	}
	if _, err := d.fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: "a\x00b"})); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("a NUL in a path: %v", err)
	}
}

// upload posts a body to /files and decodes the answer.
func (d *daemon) upload(t *testing.T, query string, body io.Reader, header http.Header) (int, []writtenEntry) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, d.url+"/files?"+query, body)
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var entries []writtenEntry
	if resp.StatusCode == http.StatusOK {
		if err := json.NewDecoder(resp.Body).Decode(&entries); err != nil {
			t.Fatal(err)
		}
	}
	return resp.StatusCode, entries
}

func (d *daemon) download(t *testing.T, path string, gz bool) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, d.url+"/files?path="+path, nil)
	if gz {
		req.Header.Set("Accept-Encoding", "gzip")
	}
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var r io.Reader = resp.Body
	if resp.Header.Get("Content-Encoding") == "gzip" {
		gr, err := gzip.NewReader(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		r = gr
	}
	b, _ := io.ReadAll(r)
	return resp.StatusCode, string(b)
}

// TestFiles: uploads (multipart, several files; octet-stream, gzip;
// metadata) and downloads (plain, gzip).
func TestFiles(t *testing.T) {
	d := newDaemon(t, Limits{})
	var mp bytes.Buffer
	mw := multipart.NewWriter(&mp)
	for _, name := range []string{"one.txt", "dir/two.txt"} {
		w, _ := mw.CreateFormFile("file", name)
		_, _ = w.Write([]byte("content of " + name))
	}
	_ = mw.Close()
	code, entries := d.upload(t, "", &mp, http.Header{"Content-Type": {mw.FormDataContentType()}, "X-Metadata-Author": {"mish"}})
	if code != http.StatusOK || len(entries) != 2 || entries[1].Path != d.home+"/dir/two.txt" || entries[1].Metadata["author"] != "mish" {
		t.Fatalf("multipart: %d %+v", code, entries)
	}
	if code, body := d.download(t, "dir/two.txt", false); code != http.StatusOK || body != "content of dir/two.txt" {
		t.Errorf("download: %d %q", code, body)
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, _ = zw.Write([]byte(strings.Repeat("zipped ", 1000)))
	_ = zw.Close()
	code, entries = d.upload(t, "path=z.txt", &gz, http.Header{"Content-Type": {"application/octet-stream"}, "Content-Encoding": {"gzip"}})
	if code != http.StatusOK || len(entries) != 1 || entries[0].Metadata != nil {
		t.Fatalf("octet-stream: %d %+v", code, entries)
	}
	if code, body := d.download(t, "z.txt", true); code != http.StatusOK || body != strings.Repeat("zipped ", 1000) {
		t.Errorf("gzip download: %d %d bytes", code, len(body))
	}
	if code, _ := d.download(t, "missing.txt", false); code != http.StatusNotFound {
		t.Errorf("missing: %d", code)
	}
	if code, _ := d.upload(t, "path=bad.txt", strings.NewReader("x"), http.Header{"X-Metadata-Good": {"bad\xe9value"}}); code != http.StatusBadRequest {
		t.Errorf("bad metadata: %d", code)
	}
	if _, err := os.Stat(filepath.Join(d.data, "bad.txt")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused upload wrote its file: %v", err)
	}
	if code, _ := d.upload(t, "path=x.txt&username=root", strings.NewReader("x"), nil); code != http.StatusUnauthorized {
		t.Errorf("as root: %d", code)
	}
}

// TestWatcher: the watcher trio sees a new file written as a create, a
// chmod and a write, and (recursive) files in a folder made after it
// started; a file is no folder to watch.
func TestWatcher(t *testing.T) {
	d := newDaemon(t, Limits{})
	ctx := ctxT(t)
	if _, err := d.fs.MakeDir(ctx, connect.NewRequest(&fspb.MakeDirRequest{Path: "w"})); err != nil {
		t.Fatal(err)
	}
	created, err := d.fs.CreateWatcher(ctx, connect.NewRequest(&fspb.CreateWatcherRequest{Path: "w", Recursive: true, IncludeEntry: true}))
	if err != nil {
		t.Fatal(err)
	}
	id := created.Msg.GetWatcherId()
	if code, _ := d.upload(t, "path=w/f.txt", strings.NewReader("x"), http.Header{"Content-Type": {"application/octet-stream"}}); code != http.StatusOK {
		t.Fatal(code)
	}
	evs, err := d.fs.GetWatcherEvents(ctx, connect.NewRequest(&fspb.GetWatcherEventsRequest{WatcherId: id}))
	if err != nil {
		t.Fatal(err)
	}
	var types []string
	for _, e := range evs.Msg.GetEvents() {
		types = append(types, e.GetType().String()+" "+e.GetName())
	}
	if strings.Join(types, ", ") != "EVENT_TYPE_CREATE f.txt, EVENT_TYPE_CHMOD f.txt, EVENT_TYPE_WRITE f.txt" {
		t.Errorf("events of a new file: %v", types)
	}
	if e := evs.Msg.GetEvents()[0].GetEntry(); e.GetPath() != d.home+"/w/f.txt" {
		t.Errorf("entry: %v", e)
	}
	if _, err := d.fs.MakeDir(ctx, connect.NewRequest(&fspb.MakeDirRequest{Path: "w/nested"})); err != nil {
		t.Fatal(err)
	}
	if code, _ := d.upload(t, "path=w/nested/g.txt", strings.NewReader("y"), http.Header{"Content-Type": {"application/octet-stream"}}); code != http.StatusOK {
		t.Fatal(code)
	}
	evs, err = d.fs.GetWatcherEvents(ctx, connect.NewRequest(&fspb.GetWatcherEventsRequest{WatcherId: id}))
	if err != nil || len(evs.Msg.GetEvents()) != 4 || evs.Msg.GetEvents()[0].GetName() != "nested" || evs.Msg.GetEvents()[3].GetName() != "nested/g.txt" {
		t.Errorf("events in a new folder: %v %v", evs, err)
	}
	if _, err := d.fs.RemoveWatcher(ctx, connect.NewRequest(&fspb.RemoveWatcherRequest{WatcherId: id})); err != nil {
		t.Fatal(err)
	}
	if _, err := d.fs.GetWatcherEvents(ctx, connect.NewRequest(&fspb.GetWatcherEventsRequest{WatcherId: id})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("a removed watcher: %v", err)
	}
	if _, err := d.fs.CreateWatcher(ctx, connect.NewRequest(&fspb.CreateWatcherRequest{Path: "w/f.txt"})); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("watching a file: %v", err)
	}
	if _, err := d.fs.CreateWatcher(ctx, connect.NewRequest(&fspb.CreateWatcherRequest{Path: "nowhere"})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("watching nothing: %v", err)
	}
}

// TestWatchDir: the streamed watch starts, then carries events.
func TestWatchDir(t *testing.T) {
	d := newDaemon(t, Limits{})
	ctx := ctxT(t)
	stream, err := d.fs.WatchDir(ctx, connect.NewRequest(&fspb.WatchDirRequest{Path: ""}))
	if err != nil || !stream.Receive() || stream.Msg().GetStart() == nil {
		t.Fatal(err, stream.Err())
	}
	if err := os.WriteFile(filepath.Join(d.data, "new.txt"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if !stream.Receive() || stream.Msg().GetFilesystem().GetName() != "new.txt" || stream.Msg().GetFilesystem().GetType() != fspb.EventType_EVENT_TYPE_CREATE {
		t.Errorf("event: %v %v", stream.Msg(), stream.Err())
	}
	stream.Close()
}
