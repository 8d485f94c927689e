package e2e

import (
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestKeptState: keep_state runs Python in the conversation's kept
// interpreter — over /mcp, with real Docker and Redis. Variables and
// loaded data persist, a final expression is echoed, plt.show() makes a
// PNG artifact; a timeout interrupts the cell and keeps the state, a cell
// that ignores the interrupt loses it (state_lost), as does close_session;
// conversations and fresh runs never see it; what a cell starts dies with
// the cell.
func TestKeptState(t *testing.T) {
	s := start(t, options{})
	cs := s.session(nil)
	cid := "kept"
	kept := func(code string, extra ...any) result {
		t.Helper()
		args := map[string]any{"language": "python", "conversationId": cid, "keep_state": true, "code": code}
		for i := 0; i+1 < len(extra); i += 2 {
			args[extra[i].(string)] = extra[i+1]
		}
		return runCode(t, cs, args)
	}
	expect := func(step string, r result, stdout string, lost bool) {
		t.Helper()
		if r.Stdout != stdout || r.StateLost != lost {
			t.Fatalf("%s: stdout %q state_lost %v (stderr %q, error %q); want %q, %v", step, r.Stdout, r.StateLost, r.Stderr, r.Error, stdout, lost)
		}
	}

	expect("load", kept("import pandas as pd\ndf = pd.DataFrame({'a': range(2_000_000)})\nlen(df)"), "2000000\n", false)
	begin := time.Now()
	r := kept("int(df['a'].sum())")
	expect("next cell", r, "1999999000000\n", false)
	t.Logf("the cell after loading 2 million rows: %v end to end, %d ms in the sandbox", time.Since(begin), r.DurationMS)

	fresh := runCode(t, cs, map[string]any{"language": "python", "conversationId": cid, "code": "print('df' in dir())"})
	if fresh.Stdout != "False\n" {
		t.Errorf("a fresh run saw the kept state: %q", fresh.Stdout)
	}
	other := runCode(t, cs, map[string]any{"language": "python", "conversationId": "kept-other", "keep_state": true, "code": "'df' in globals()"})
	expect("another conversation", other, "False\n", false)

	r = kept("import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()")
	if len(r.Artifacts) != 1 || r.Artifacts[0].Name != "figure_1.png" || r.Artifacts[0].MimeType != "image/png" {
		t.Errorf("plt.show() artifacts: %+v (stderr %q)", r.Artifacts, r.Stderr)
	}

	// What a cell starts ends with it; threads of the interpreter stay.
	kept("import subprocess, threading, time\nsubprocess.Popen(['sleep', '300'])\nticks = []\nthreading.Thread(target=lambda: [ticks.append(1) or time.sleep(0.05) for _ in range(1000)], daemon=True).start()")
	expect("children gone, threads kept",
		kept("import os, time\nn = len(ticks); time.sleep(0.3)\nprint([p for p in os.listdir('/proc') if p.isdigit() and open(f'/proc/{p}/cmdline', 'rb').read().startswith(b'sleep')], len(ticks) > n)"),
		"[] True\n", false)

	r = kept("import time\nprint('working', flush=True)\ntime.sleep(60)", "timeout_seconds", 2)
	if !r.TimedOut || r.StateLost || !strings.Contains(r.Stderr, "KeyboardInterrupt") {
		t.Fatalf("interrupted cell: %+v", r)
	}
	expect("after the interrupt", kept("df.shape[0]"), "2000000\n", false)

	r = kept("import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(60)", "timeout_seconds", 2)
	if !r.TimedOut || !r.StateLost {
		t.Fatalf("a cell that ignores the interrupt: %+v", r)
	}
	expect("after the lost state", kept("'df' in globals()"), "False\n", false)

	kept("x = 1")
	if res := call(t, cs, "close_session", map[string]any{"conversationId": cid}, nil); res.IsError {
		t.Fatalf("close_session: %s", text(res))
	}
	expect("after close_session", kept("'x' in globals()"), "False\n", true)
	expect("and then", kept("'x' in globals()"), "False\n", false)

	var e toolError
	if res := call(t, cs, "run_code", map[string]any{"language": "bash", "keep_state": true, "code": "echo"}, &e); !res.IsError || e.Error != "invalid_argument" {
		t.Errorf("keep_state for bash: %s", text(res))
	}
}

// TestKeptStateCancel: cancel_run interrupts a kept-state cell; the state
// survives.
func TestKeptStateCancel(t *testing.T) {
	s := start(t, options{})
	cs := s.session(nil)
	args := func(code string) map[string]any {
		return map[string]any{"language": "python", "conversationId": "kc", "keep_state": true, "code": code}
	}
	runCode(t, cs, args("v = 'kept'"))
	st := startRun(t, cs, args("import time\nprint('go', flush=True)\ntime.sleep(60)"))
	waitFor(t, func() bool {
		var p progress
		call(t, cs, "get_run", map[string]any{"run_id": st.RunID}, &p)
		return len(p.Events) > 0 && p.Status == "running"
	})
	call(t, cs, "cancel_run", map[string]any{"run_id": st.RunID}, nil)
	r, _ := waitRun(t, cs, st.RunID)
	if !r.Cancelled || r.StateLost {
		t.Fatalf("cancelled cell: %+v", r)
	}
	if r := runCode(t, cs, args("v")); r.Stdout != "'kept'\n" || r.StateLost {
		t.Fatalf("after cancel: %+v", r)
	}
}

// keptState is pause_session's and resume_session's answer.
type keptState struct {
	ConversationID string   `json:"conversationId"`
	Paused         bool     `json:"paused"`
	StateBytes     int64    `json:"state_bytes"`
	StateRestored  bool     `json:"state_restored"`
	LostVariables  []string `json:"lost_variables"`
}

// keptCell runs a kept-state cell of conversation cid.
func keptCell(t *testing.T, cs *mcp.ClientSession, cid, code string) result {
	t.Helper()
	return runCode(t, cs, map[string]any{"language": "python", "conversationId": cid, "keep_state": true, "code": code})
}

// TestKeptStatePauseResume: pause_session saves a kept interpreter's state
// (a 100 MB DataFrame, a function and a class defined in cells, shared
// objects) and lets its sandbox go; the next cell restores it
// (state_restored), naming what could not be kept; resume_session and the
// REST routes do the same; the saved state never shows among the
// conversation's files.
func TestKeptStatePauseResume(t *testing.T) {
	s := start(t, options{})
	cs := s.session(nil)
	cid := "paused"
	r := keptCell(t, cs, cid, "import numpy as np, pandas as pd, socket\n"+
		"df = pd.DataFrame(np.arange(100 * 2**20 // 8, dtype='int64').reshape(-1, 8))\n"+
		"def twice(v):\n    return 2 * v\n"+
		"class Box:\n    def __init__(self, v): self.v = v\n"+
		"box = Box([1, 2])\nalias = box.v\nconn = socket.socket()\nprint(df.shape, df.memory_usage().sum() >= 100 * 2**20)")
	if r.Stdout != "(1638400, 8) True\n" {
		t.Fatalf("load: %+v", r)
	}
	var p keptState
	begin := time.Now()
	if res := call(t, cs, "pause_session", map[string]any{"conversationId": cid}, &p); res.IsError || !p.Paused {
		t.Fatalf("pause_session: %s", text(res))
	}
	t.Logf("pause of a 100 MB DataFrame: %v end to end, %d bytes stored", time.Since(begin), p.StateBytes)
	if p.StateBytes < 100<<20 || !slices.Equal(p.LostVariables, []string{"conn"}) {
		t.Errorf("pause_session: %+v", p)
	}
	if s.containers(s.executors[0]) > 1 {
		t.Log("the paused sandbox went back to the pool")
	}
	var files struct {
		Files []fileInfo `json:"files"`
	}
	call(t, cs, "list_files", map[string]any{"conversationId": cid}, &files)
	if len(files.Files) != 0 {
		t.Errorf("the saved state shows among the files: %+v", files.Files)
	}

	begin = time.Now()
	r = keptCell(t, cs, cid, "alias.append(3)\nprint(df.shape, int(df[7].iloc[-1]), twice(box.v[2]), box.v is alias)")
	t.Logf("the cell that resumed it: %v end to end, %d ms in the sandbox", time.Since(begin), r.DurationMS)
	if r.Stdout != "(1638400, 8) 13107199 6 True\n" || !r.StateRestored || r.StateLost ||
		!slices.Equal(r.LostVariables, []string{"conn"}) {
		t.Fatalf("after the pause: %+v", r)
	}
	if r = keptCell(t, cs, cid, "len(alias)"); r.Stdout != "3\n" || r.StateRestored || r.StateLost {
		t.Fatalf("the next cell: %+v", r)
	}

	// REST: pause, then resume at once.
	if code := s.request("POST", "/v1/conversations/"+cid+"/pause", nil, &p); code != 200 || !p.Paused {
		t.Fatalf("POST pause: %d %+v", code, p)
	}
	begin = time.Now()
	if code := s.request("POST", "/v1/conversations/"+cid+"/resume", nil, &p); code != 200 || !p.StateRestored {
		t.Fatalf("POST resume: %d %+v", code, p)
	}
	t.Logf("resume of a 100 MB DataFrame: %v end to end", time.Since(begin))
	if r = keptCell(t, cs, cid, "len(alias)"); r.Stdout != "3\n" || r.StateRestored || r.StateLost {
		t.Fatalf("after resume: %+v", r)
	}
	// Nothing to pause: paused false; resume_session of a state running
	// restores nothing.
	var q keptState
	call(t, cs, "resume_session", map[string]any{"conversationId": cid}, &q)
	if q.StateRestored {
		t.Errorf("resume_session with the interpreter running: %+v", q)
	}
	if res := call(t, cs, "pause_session", map[string]any{"conversationId": "never-ran"}, &q); res.IsError || q.Paused {
		t.Errorf("pause_session of a conversation without state: %s", text(res))
	}
}

// TestKeptStateSurvivesIdleAndRestart: a kept interpreter idle past its
// TTL is paused as its sandbox goes, and its state comes back with the
// next cell; so it does when its executor is stopped (SIGTERM) and
// another takes the conversation up. The TTL ends idle MCP sessions too
// (the contract): each cell after a wait comes in a session of its own,
// as a client whose session ended would open one.
func TestKeptStateSurvivesIdleAndRestart(t *testing.T) {
	s := start(t, options{env: []string{"SANDBOX_SESSION_TTL=1s"}})
	cid := "survivor"
	keptCell(t, s.session(nil), cid, "import collections\nn = 41\nseen = collections.Counter('abca')")
	// The janitor prunes every 30 s: the sandbox goes within that.
	waitForLong(t, 90*time.Second, func() bool {
		return strings.Contains(s.procs[0].out.String(), "saved a kept interpreter's state")
	})
	r := keptCell(t, s.session(nil), cid, "n += 1\nprint(n, seen['a'])")
	if r.Stdout != "42 2\n" || !r.StateRestored || r.StateLost {
		t.Fatalf("after idling out: %+v", r)
	}

	victim := s.procs[0]
	if err := victim.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	<-victim.done
	if !strings.Contains(victim.out.String(), "saved a kept interpreter's state") {
		t.Fatalf("the stopping executor saved nothing:\n%s", victim.out.String())
	}
	p, _ := s.startExecutor()
	waitFor(t, func() bool { return strings.Contains(p.out.String(), "executor started") })
	r = keptCell(t, s.session(nil), cid, "n += 1\nprint(n, seen['a'])")
	if r.Stdout != "43 2\n" || !r.StateRestored || r.StateLost {
		t.Fatalf("after the executor's restart: %+v", r)
	}
}

// waitForLong is waitFor with a deadline of its own.
func waitForLong(t *testing.T, d time.Duration, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatal("timed out waiting")
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestKeptStateMovesWhileOldRuns: an executor told to stop (SIGTERM)
// saves its idle kept interpreters before its conversations may go
// elsewhere; a conversation's next cell then runs on the other executor,
// while the old one still finishes a run, and finds its state there.
func TestKeptStateMovesWhileOldRuns(t *testing.T) {
	s := start(t, options{executors: 2, env: []string{"EXECUTOR_SHUTDOWN_GRACE=60s"}})
	cs := s.session(nil)
	cid := "mover"
	host := strings.TrimSpace(keptCell(t, cs, cid, "import socket\nn = 41\nprint(socket.gethostname())").Stdout)
	old := s.containerExecutor(host)
	// A run that keeps the old executor busy: a conversation that lives
	// there (runs of a new one go to either).
	busy := ""
	for i := 0; busy == "" && i < 20; i++ {
		c := fmt.Sprintf("busy-%d", i)
		r := runCode(t, cs, map[string]any{"language": "bash", "conversationId": c, "code": "hostname"})
		if s.containerExecutor(strings.TrimSpace(r.Stdout)) == old {
			busy = c
		}
	}
	if busy == "" {
		t.Fatal("no conversation landed on the old executor")
	}
	var started struct {
		RunID string `json:"run_id"`
	}
	if res := call(t, cs, "start_run", map[string]any{"language": "bash", "conversationId": busy, "code": "sleep 45"}, &started); res.IsError {
		t.Fatal(text(res))
	}
	time.Sleep(time.Second) // claimed and running there

	victim := proc0(t, s, old)
	if err := victim.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitForLong(t, 60*time.Second, func() bool {
		return strings.Contains(victim.out.String(), "saved a kept interpreter's state")
	})
	r := keptCell(t, cs, cid, "n += 1\nprint(n, socket.gethostname())")
	select {
	case <-victim.done:
		t.Fatal("the old executor stopped before the move was tested")
	default:
	}
	fields := strings.Fields(r.Stdout)
	if len(fields) != 2 || fields[0] != "42" || !r.StateRestored || r.StateLost {
		t.Fatalf("after the move: %+v", r)
	}
	if s.containerExecutor(fields[1]) == old {
		t.Errorf("the cell ran on the stopping executor %s", old)
	}
	call(t, cs, "cancel_run", map[string]any{"run_id": started.RunID}, nil)
	<-victim.done
}

// TestKeptStateS3: with FILE_STORE on a real S3 server, a paused kept
// interpreter's state goes to the bucket, beside the conversation's files
// and never among them, and the next cell restores it from there.
func TestKeptStateS3(t *testing.T) {
	s := start(t, options{s3: true})
	cs := s.session(nil)
	cid := "s3-kept"
	keptCell(t, cs, cid, "import numpy as np\nv = np.arange(1_000_000)\nword = 'kept'")
	var p keptState
	if res := call(t, cs, "pause_session", map[string]any{"conversationId": cid}, &p); res.IsError || !p.Paused || p.StateBytes < 8_000_000 {
		t.Fatalf("pause_session: %s", text(res))
	}
	if got := fileNames(t, cs, cid); got != "" {
		t.Errorf("the saved state shows among the files: %q", got)
	}
	r := keptCell(t, cs, cid, "print(int(v.sum()), word)")
	if r.Stdout != "499999500000 kept\n" || !r.StateRestored || r.StateLost {
		t.Fatalf("after the pause: %+v", r)
	}
}

// TestKeptStateTakesItsRoom: while a conversation's state is saved, its
// programs may write its quota less the state, in loop and walk mode and
// with FILE_STORE=s3 (where the executor's working copy learns the state
// from the bucket); once the state is restored they may write the whole
// quota again.
func TestKeptStateTakesItsRoom(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts options
	}{
		{"loop", options{}},
		{"walk", options{env: []string{"SANDBOX_QUOTA_MODE=walk"}}},
		{"s3", options{s3: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The kernel refuses the write in loop mode; in walk mode the
			// executor stops the run that went past.
			hard := tc.name != "walk"
			mode := map[bool]string{true: "loop", false: "walk"}[hard]
			tc.opts.env = append(tc.opts.env, "SANDBOX_QUOTA_BYTES=67108864", "SANDBOX_QUOTA_MODE="+mode)
			s := start(t, tc.opts)
			cs := s.session(nil)
			cid := "roomy"
			keptCell(t, cs, cid, "import os\nblob = os.urandom(30 << 20)")
			var p keptState
			if res := call(t, cs, "pause_session", map[string]any{"conversationId": cid}, &p); res.IsError || !p.Paused || p.StateBytes < 30<<20 {
				t.Fatalf("pause_session: %s", text(res))
			}
			write40 := map[string]any{"language": "python", "conversationId": cid,
				"code": "import os\ntry:\n    open('big.bin', 'wb').write(b'x' * (40 << 20))\nfinally:\n    print(os.path.getsize('big.bin'))"}
			r := runCode(t, cs, write40)
			refused := strings.Contains(r.Stderr, "No space left on device")
			if r.Success || hard && !refused || !hard && !strings.Contains(r.Error, "quota of 67108864 bytes") {
				t.Errorf("40 MB written in a 64 MB quota beside a 30 MB state: %+v", r)
			}
			runCode(t, cs, map[string]any{"language": "python", "conversationId": cid, "code": "import os\nos.remove('big.bin')"})
			if r := keptCell(t, cs, cid, "print(len(blob))"); r.Stdout != fmt.Sprintln(30<<20) || !r.StateRestored {
				t.Fatalf("the cell that restores it: %+v", r)
			}
			if r := runCode(t, cs, write40); !r.Success || r.Stdout != fmt.Sprintln(40<<20) {
				t.Errorf("40 MB once the state is restored: %+v", r)
			}
		})
	}
}
