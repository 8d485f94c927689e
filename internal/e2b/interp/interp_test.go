package interp

import (
	"encoding/json"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/runbox-dev/runbox"
)

// TestDemuxer: a cell's stdout is its own output and its marked lines,
// however the chunks cut them; a line marked with another nonce (a
// program printing one it made up) is output.
func TestDemuxer(t *testing.T) {
	const marker = "\x1eRBXn0nce:"
	stream := "hello\n" + marker + `{"type":"result","text":"42"}` + "\nmore" + marker + `{"type":"number_of_executions","execution_count":1}` +
		"\n\x1eRBXother:{\"type\":\"error\"}\n\x1eRB"
	for _, size := range []int{1, 2, 3, 7, 13, len(stream)} {
		var out strings.Builder
		var marked, order []string
		d := &demuxer{marker: []byte(marker), stdout: func(s string) { out.WriteString(s); order = append(order, "out") },
			marked: func(b []byte) { marked = append(marked, string(b)); order = append(order, "marked") }}
		for i := 0; i < len(stream); i += size {
			d.feed([]byte(stream[i:min(i+size, len(stream))]))
		}
		d.flush()
		if want := "hello\nmore\x1eRBXother:{\"type\":\"error\"}\n\x1eRB"; out.String() != want {
			t.Errorf("chunks of %d: output %q", size, out.String())
		}
		if len(marked) != 2 || !strings.Contains(marked[0], `"42"`) || !strings.Contains(marked[1], "execution_count") {
			t.Errorf("chunks of %d: marked %q", size, marked)
		}
		// Output before a marked line is handed on before it.
		if first := slices.Index(order, "marked"); first < 0 || !slices.Contains(order[:first], "out") {
			t.Errorf("chunks of %d: in the order %v", size, order)
		}
	}
}

// TestCellSpec: a Python cell is a kept-state run of the helper, its
// source and settings passed as data, never as code.
func TestCellSpec(t *testing.T) {
	src := "print('\"''' + \"\\n\")\nx = 1"
	spec := cellSpec("sbx", runbox.E2BContext{ID: "c1", Cwd: "/home/user"}, executeJSON{Code: src, EnvVars: map[string]string{"A": "b"}}, "n")
	if !spec.KeepState || spec.Language != "python" || spec.ConversationID != "sbx" {
		t.Fatalf("%+v", spec)
	}
	// The call's argument is a JSON literal of [code, context, env, cwd, nonce].
	call := spec.Code[strings.LastIndex(spec.Code, "loads(")+len("loads(") : strings.LastIndex(spec.Code, "))")]
	var lit string
	if err := json.Unmarshal([]byte(call), &lit); err != nil {
		t.Fatal(err)
	}
	var args []any
	if err := json.Unmarshal([]byte(lit), &args); err != nil || args[0] != src || args[1] != "c1" || args[4] != "n" {
		t.Errorf("%v %v", args, err)
	}
}

// TestFailure: how a run that did not end as a cell does is told.
func TestFailure(t *testing.T) {
	for _, c := range []struct {
		res  *runbox.Result
		cell bool
		name string
	}{
		{&runbox.Result{TimedOut: true}, true, "TimeoutError"},
		{&runbox.Result{OOMKilled: true}, true, "MemoryError"},
		{&runbox.Result{ExitCode: 2, Stderr: "boom"}, false, "ExitError"},
		{&runbox.Result{ExitCode: 0}, true, ""},
	} {
		got := failure(c.res, c.cell)
		if (got == nil) != (c.name == "") || got != nil && got["name"] != c.name {
			t.Errorf("%+v: %v", c.res, got)
		}
	}
}

// TestCellPreload: the helper names none of the modules whose mention has
// the Python runner's zygote import the data stack (runners/python's
// -preload-when): a cell that does not use them starts without them.
func TestCellPreload(t *testing.T) {
	if m := regexp.MustCompile(`\b(pandas|numpy|matplotlib|seaborn|scipy)\b`).FindString(cellHelper); m != "" {
		t.Errorf("cell.py names %s", m)
	}
}
