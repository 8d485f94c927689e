package e2e

import (
	"strings"
	"testing"
	"time"
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
