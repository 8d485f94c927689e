package agent

import (
	"strings"
	"testing"
	"time"
)

// TestKernelKeepsState: cells of the kept interpreter share one namespace,
// a final bare expression is echoed, an exception ends only its cell, and
// ordinary runs beside it stay fresh processes.
func TestKernelKeepsState(t *testing.T) {
	c := startPythonAgent(t)
	steps := []struct {
		name    string
		run     Run
		stdin   string
		wantOut string
		wantErr string
		code    int
		kernel  string
	}{
		{"define", Run{Code: "x = 41\nimport fractions", KeepState: true}, "", "", "", 0, KernelNew},
		{"use and echo", Run{Code: "x += 1\nx", KeepState: true}, "", "42\n", "", 0, KernelKept},
		{"none is not echoed", Run{Code: "None", KeepState: true}, "", "", "", 0, KernelKept},
		{"stdin per cell", Run{Code: "input() + str(x)", KeepState: true}, "answer ", "'answer 42'\n", "", 0, KernelKept},
		{"error ends the cell", Run{Code: "y = 1\n{}['k']", KeepState: true}, "", "", "KeyError: 'k'", 1, KernelKept},
		{"state survives", Run{Code: "print(x, y, fractions.Fraction(1, 2))", KeepState: true}, "", "42 1 1/2\n", "", 0, KernelKept},
		{"sys.exit ends the cell", Run{Code: "import sys; sys.exit(3)", KeepState: true}, "", "", "", 3, KernelKept},
		{"run env", Run{Code: "import os; os.environ['CELL']", Env: map[string]string{"CELL": "c"}, KeepState: true}, "", "'c'\n", "", 0, KernelKept},
		{"fresh run beside it", Run{Code: "print('x' in globals())"}, "", "False\n", "", 0, ""},
		{"kernel still there", Run{Code: "x", KeepState: true}, "", "42\n", "", 0, KernelKept},
	}
	for _, s := range steps {
		o := runOnce(t, c, s.run, s.stdin)
		if o.failed != "" {
			t.Fatalf("%s: failed: %s", s.name, o.failed)
		}
		if o.stdout != s.wantOut || !strings.Contains(o.stderr, s.wantErr) || o.exit.ExitCode != s.code || o.exit.Kernel != s.kernel || o.exit.StateLost {
			t.Errorf("%s: stdout %q stderr %q exit %+v; want %q, %q, code %d, kernel %q",
				s.name, o.stdout, o.stderr, o.exit, s.wantOut, s.wantErr, s.code, s.kernel)
		}
	}
}

// TestKernelInterrupt: a kill frame interrupts a cell (KeyboardInterrupt)
// and the state survives; a cell that ignores the interrupt is killed with
// its kernel, and the next cell starts a new one.
func TestKernelInterrupt(t *testing.T) {
	c := startPythonAgent(t)
	// interrupt runs code, which prints a line once it is where the
	// interrupt must find it, and interrupts it then.
	interrupt := func(code string) outcome {
		t.Helper()
		if err := c.Start(Run{Code: code, KeepState: true}); err != nil {
			t.Fatal(err)
		}
		c.CloseStdin()
		var ready string
		for !strings.Contains(ready, "\n") {
			m, err := c.Recv()
			if err != nil {
				t.Fatalf("Recv: %v", err)
			}
			if m.Kind != Stdout {
				t.Fatalf("before the cell was ready: %+v", m)
			}
			ready += string(m.Data)
		}
		if err := c.Kill(); err != nil {
			t.Fatal(err)
		}
		o := collect(t, c)
		o.stdout = ready + o.stdout
		return o
	}
	if o := runOnce(t, c, Run{Code: "state = 'kept'", KeepState: true}, ""); o.exit.ExitCode != 0 {
		t.Fatalf("define: %+v", o)
	}
	o := interrupt("import time\nprint('sleeping', flush=True)\ntime.sleep(30)")
	if !strings.Contains(o.stderr, "KeyboardInterrupt") || o.exit.StateLost {
		t.Fatalf("interrupted cell: %+v", o)
	}
	if o := runOnce(t, c, Run{Code: "state", KeepState: true}, ""); o.stdout != "'kept'\n" || o.exit.Kernel != KernelKept {
		t.Fatalf("after an interrupt: %+v", o)
	}
	begin := time.Now()
	o = interrupt("import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nprint('ignoring', flush=True)\ntime.sleep(30)")
	if !o.exit.StateLost {
		t.Fatalf("a cell that ignores the interrupt: %+v", o)
	}
	if took := time.Since(begin); took > 20*time.Second {
		t.Errorf("ignored interrupt took %v to end", took)
	}
	o = runOnce(t, c, Run{Code: "'state' in globals()", KeepState: true}, "")
	if o.stdout != "False\n" || o.exit.Kernel != KernelNew {
		t.Fatalf("after the kernel was killed: %+v", o)
	}
}
