package agent

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"
)

// startAgent runs Serve with bash on this host, wired to a Conn.
func startAgent(t *testing.T) *Conn { return startAgentWith(t, 0) }

func startAgentWith(t *testing.T, lineWait time.Duration) *Conn {
	t.Helper()
	return startAgentConfig(t, func(cfg *Config) { cfg.LineWait = lineWait }, nil)
}

// startAgentConfig runs Serve with bash, its configuration changed by
// change, proxy connections going to onProxy.
func startAgentConfig(t *testing.T, change func(*Config), onProxy func(net.Conn, uint32)) *Conn {
	t.Helper()
	cfg := Config{
		Launch:  []string{"bash"},
		Ext:     "sh",
		Dir:     t.TempDir(),
		Scratch: t.TempDir(),
		Env:     []string{"PATH=" + os.Getenv("PATH"), "BASE=base"},
	}
	if change != nil {
		change(&cfg)
	}
	return serveAgent(t, cfg, onProxy)
}

// serveAgent runs Serve with cfg, wired to a Conn.
func serveAgent(t *testing.T, cfg Config, onProxy func(net.Conn, uint32)) *Conn {
	t.Helper()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, cfg, inR, outW); outW.Close() }()
	t.Cleanup(func() {
		inW.Close()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Serve: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Error("Serve did not return after its input closed")
		}
		cancel()
	})
	c := NewConn(outR, inW)
	if onProxy != nil {
		c.OnProxy(onProxy)
	}
	// The test's agent and Conn share the folder, as a sandbox and its
	// executor share the one mounted.
	if cfg.ProxySocket != "" {
		if err := c.ListenProxy(cfg.ProxySocket); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
	}
	h, err := c.Hello()
	if err != nil {
		t.Fatal(err)
	}
	if h.Version != Version {
		t.Fatalf("hello version %d, want %d", h.Version, Version)
	}
	return c
}

type outcome struct {
	stdout, stderr string
	chunks         []string // stdout messages in order
	exit           Exit
	failed         string
}

// send starts a run with its whole stdin.
func send(t *testing.T, c *Conn, run Run, stdin string) {
	t.Helper()
	if err := c.Start(run); err != nil {
		t.Fatal(err)
	}
	if err := c.Stdin([]byte(stdin)); err != nil {
		t.Fatal(err)
	}
	if err := c.CloseStdin(); err != nil {
		t.Fatal(err)
	}
}

// collect reads messages until the run ends.
func collect(t *testing.T, c *Conn) outcome {
	t.Helper()
	var o outcome
	for {
		m, err := c.Recv()
		if err != nil {
			t.Fatalf("Recv: %v", err)
		}
		switch m.Kind {
		case Stdout:
			o.stdout += string(m.Data)
			o.chunks = append(o.chunks, string(m.Data))
		case Stderr:
			o.stderr += string(m.Data)
		case Exited:
			o.exit = m.Exit
			return o
		case Failed:
			o.failed = m.Err
			return o
		}
	}
}

func TestServeRuns(t *testing.T) {
	tests := []struct {
		name       string
		run        Run
		stdin      string
		wantOut    string
		wantErr    string
		wantCode   int
		wantSignal int
	}{
		{name: "output and exit code", run: Run{Code: "echo hi; echo oops >&2; exit 3"}, wantOut: "hi\n", wantErr: "oops\n", wantCode: 3},
		{name: "stdin in order", run: Run{Code: "read a; read b; echo \"$b-$a\""}, stdin: "one\ntwo\n", wantOut: "two-one\n"},
		{name: "empty stdin is EOF", run: Run{Code: "cat; echo end"}, wantOut: "end\n"},
		{name: "run env over base env", run: Run{Code: "echo $BASE $X", Env: map[string]string{"X": "x", "BASE": "over"}}, wantOut: "over x\n"},
		{name: "working directory", run: Run{Code: "test -w . && echo ok"}, wantOut: "ok\n"},
		{name: "killed by a signal", run: Run{Code: "kill -9 $$"}, wantCode: -1, wantSignal: 9},
		{name: "background child does not hold the run", run: Run{Code: "sleep 60 & echo started"}, wantOut: "started\n"},
		// A program leaves a FIFO where the next program's file goes, and a
		// link in place of the folder: the next one still runs.
		{name: "plants a FIFO and a link", run: Run{Code: `rm -f "$0"; mkfifo "$0"; echo planted`}, wantOut: "planted\n"},
		{name: "the next program runs over the FIFO", run: Run{Code: "echo next"}, wantOut: "next\n"},
		{name: "plants a link for the folder", run: Run{Code: `d=$(dirname "$0"); mv "$d" "$d.real"; ln -s /nonexistent "$d"; echo linked`}, wantOut: "linked\n"},
		{name: "the next program runs over the link", run: Run{Code: "echo again"}, wantOut: "again\n"},
	}
	c := startAgent(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			send(t, c, tt.run, tt.stdin)
			o := collect(t, c)
			if o.failed != "" {
				t.Fatalf("run failed to start: %s", o.failed)
			}
			if o.stdout != tt.wantOut || o.stderr != tt.wantErr {
				t.Errorf("stdout %q stderr %q, want %q %q", o.stdout, o.stderr, tt.wantOut, tt.wantErr)
			}
			if o.exit.ExitCode != tt.wantCode || o.exit.Signal != tt.wantSignal {
				t.Errorf("exit %+v, want code %d signal %d", o.exit, tt.wantCode, tt.wantSignal)
			}
		})
	}
}

func TestServeStreamsOutputAsProduced(t *testing.T) {
	c := startAgent(t)
	if err := c.Start(Run{Code: "echo a; sleep 0.5; echo b"}); err != nil {
		t.Fatal(err)
	}
	c.CloseStdin()
	m, err := c.Recv()
	if err != nil || m.Kind != Stdout || string(m.Data) != "a\n" {
		t.Fatalf("first message %+v %v, want stdout a", m, err)
	}
	o := collect(t, c)
	if o.stdout != "b\n" {
		t.Errorf("rest %q, want b", o.stdout)
	}
}

func TestServeCoalescesLinePieces(t *testing.T) {
	// A wide window, so that a loaded machine does not split the line.
	c := startAgentWith(t, 200*time.Millisecond)
	if err := c.Start(Run{Code: "printf first; printf '\\n'; printf second; sleep 1; printf '\\n'"}); err != nil {
		t.Fatal(err)
	}
	c.CloseStdin()
	o := collect(t, c)
	n := len(o.chunks)
	if n < 2 || o.chunks[n-1] != "\n" || strings.Join(o.chunks[:n-1], "") != "first\nsecond" || o.chunks[0] == "first" {
		t.Errorf("chunks %q, want the first line whole, and the newline 0.3s later apart", o.chunks)
	}
}

func TestServeKill(t *testing.T) {
	c := startAgent(t)
	// The program ignores its input, so queued stdin must not delay the kill.
	if err := c.Start(Run{Code: "echo up; sleep 60"}); err != nil {
		t.Fatal(err)
	}
	if err := c.Stdin(bytes.Repeat([]byte("x"), 1<<20)); err != nil {
		t.Fatal(err)
	}
	if m, err := c.Recv(); err != nil || string(m.Data) != "up\n" {
		t.Fatalf("got %+v %v", m, err)
	}
	start := time.Now()
	if err := c.Kill(); err != nil {
		t.Fatal(err)
	}
	o := collect(t, c)
	if o.exit.Signal != 9 || o.exit.ExitCode != -1 {
		t.Errorf("exit %+v, want killed", o.exit)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("kill took %v", d)
	}
}

func TestServeOneProgramAtATime(t *testing.T) {
	c := startAgent(t)
	if err := c.Start(Run{Code: "sleep 60"}); err != nil {
		t.Fatal(err)
	}
	if err := c.Start(Run{Code: "echo second"}); err != nil {
		t.Fatal(err)
	}
	m, err := c.Recv()
	if err != nil || m.Kind != Failed || !strings.Contains(m.Err, "already running") {
		t.Fatalf("got %+v %v, want a failure", m, err)
	}
	c.Kill()
	collect(t, c)
}

func TestRecvRejectsOutOfProtocol(t *testing.T) {
	frame := func(typ byte, payload string) []byte {
		b := []byte{typ, 0, 0, 0, 0}
		binary.BigEndian.PutUint32(b[1:], uint32(len(payload)))
		return append(b, payload...)
	}
	huge := []byte{frameStdout, 0xff, 0xff, 0xff, 0xff}
	tests := []struct {
		name  string
		input []byte
		want  error
	}{
		{"unknown type", frame('Z', ""), nil},
		{"too large", huge, ErrFrameTooLarge},
		{"truncated payload", frame(frameStdout, "abc")[:6], io.ErrUnexpectedEOF},
		{"malformed exit", frame(frameExit, "{"), nil},
		{"request type from the sandbox", frame(frameRun, "{}"), nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := NewConn(bytes.NewReader(tt.input), io.Discard)
			_, err := c.Recv()
			if err == nil {
				t.Fatal("Recv accepted it")
			}
			if tt.want != nil && !errors.Is(err, tt.want) {
				t.Errorf("error %v, want %v", err, tt.want)
			}
		})
	}
}

func FuzzRecv(f *testing.F) {
	f.Add([]byte{frameStdout, 0, 0, 0, 2, 'h', 'i'})
	f.Add([]byte{frameExit, 0, 0, 0, 15, '{', '"', 'e', 'x', 'i', 't', '_', 'c', 'o', 'd', 'e', '"', ':', '1', '}'})
	f.Add([]byte{frameFail, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, data []byte) {
		c := &Conn{r: bufio.NewReader(bytes.NewReader(data)), w: newFrameWriter(io.Discard)}
		for range 64 {
			m, err := c.Recv()
			if err != nil {
				return
			}
			if len(m.Data) > MaxPayload {
				t.Fatalf("payload of %d bytes passed", len(m.Data))
			}
		}
	})
}
