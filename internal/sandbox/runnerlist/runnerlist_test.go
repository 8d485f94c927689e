package runnerlist

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const python = `{"image": "runner-python:latest", "labels": {"sandbox.runner": "true", "sandbox.language": "python", "sandbox.version": "Python 3.11.2", "runbox.hash": "0123456789abcdef"}}`

func TestParse(t *testing.T) {
	list, err := Parse(strings.NewReader(`{"runners": [` + python + `,
		{"image": "registry.example.com:5000/team/runner-bash@sha256:` + strings.Repeat("ab", 32) + `", "labels": {"sandbox.runner": "true", "sandbox.language": "bash"}},
		{"image": "runner-template-node:v2", "labels": {"sandbox.runner": "true", "sandbox.template": "node", "sandbox.template.port": "3000"}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 3 || !slices.Equal(list[0].Tags, []string{"runner-python:latest"}) ||
		list[0].Labels["sandbox.version"] != "Python 3.11.2" || list[2].Labels["sandbox.template"] != "node" {
		t.Fatalf("list = %+v", list)
	}
	ctx := context.Background()
	for label, want := range map[string]int{
		"sandbox.runner=true": 3, "sandbox.language=bash": 1, "sandbox.template": 1, "sandbox.runner=false": 0, "other": 0,
	} {
		got, err := list.Images(ctx, label)
		if err != nil || len(got) != want {
			t.Errorf("Images(%q) = %d images, %v; want %d", label, len(got), err, want)
		}
	}
}

func TestParseRefuses(t *testing.T) {
	entry := func(image, labels string) string {
		return `{"runners": [{"image": "` + image + `", "labels": {` + labels + `}}]}`
	}
	const ok = `"sandbox.runner": "true", "sandbox.language": "python"`
	for name, tc := range map[string]struct{ in, want string }{
		"empty":            {``, "not a runner list"},
		"not json":         {`runner-python:latest`, "not a runner list"},
		"no runner":        {`{"runners": []}`, "no runner"},
		"unknown field":    {`{"runners": [], "run": "sh"}`, "unknown field"},
		"unknown in entry": {`{"runners": [{"image": "runner-python:latest", "command": ["sh"], "labels": {` + ok + `}}]}`, "unknown field"},
		"two values":       {`{"runners": [` + python + `]} {}`, "more than one"},
		"twice":            {`{"runners": [` + python + `,` + python + `]}`, "listed twice"},
		"no tag":           {entry("runner-python", ok), "name a tag or a digest"},
		"upper case":       {entry("Runner-Python:latest", ok), "image"},
		"space":            {entry("runner-python:latest --privileged", ok), "image"},
		"newline":          {entry(`runner-python:latest\n`, ok), "image"},
		"bad digest":       {entry("runner-python@sha256:00", ok), "image"},
		"long image":       {entry("runner-"+strings.Repeat("a", 600)+":x", ok), "image"},
		"not a runner":     {entry("runner-python:latest", `"sandbox.language": "python"`), "sandbox.runner=true"},
		"runner false":     {entry("runner-python:latest", `"sandbox.runner": "false", "sandbox.language": "python"`), "sandbox.runner=true"},
		"no language":      {entry("runner-base:latest", `"sandbox.runner": "true"`), "exactly one"},
		"both":             {entry("runner-python:latest", ok+`, "sandbox.template": "node"`), "exactly one"},
		"bad language":     {entry("runner-python:latest", `"sandbox.runner": "true", "sandbox.language": "../python"`), "lower-case"},
		"long language":    {entry("runner-python:latest", `"sandbox.runner": "true", "sandbox.language": "`+strings.Repeat("p", 33)+`"`), "lower-case"},
		"bad label key":    {entry("runner-python:latest", ok+`, "Sandbox Runner": "x"`), "not a label's name"},
		"control in value": {entry("runner-python:latest", ok+`, "sandbox.version": "3.11\u001b[2J"`), "printable"},
		"long value":       {entry("runner-python:latest", ok+`, "sandbox.version": "`+strings.Repeat("v", 1025)+`"`), "printable"},
		"too large":        {`{"runners": [` + python + `], "x": "` + strings.Repeat("x", MaxBytes) + `"}`, "larger than"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Parse(strings.NewReader(tc.in))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Parse = %v; want an error with %q", err, tc.want)
			}
		})
	}
}

func TestParseBounds(t *testing.T) {
	many := make([]string, MaxRunners+1)
	for i := range many {
		many[i] = `{"image": "runner-python:v` + strconv.Itoa(i) + `", "labels": {"sandbox.runner": "true", "sandbox.language": "python"}}`
	}
	if _, err := Parse(strings.NewReader(`{"runners": [` + strings.Join(many, ",") + `]}`)); err == nil || !strings.Contains(err.Error(), "more than") {
		t.Fatalf("%d runners: %v", len(many), err)
	}
	labels := []string{`"sandbox.runner": "true", "sandbox.language": "python"`}
	for i := range MaxLabels {
		labels = append(labels, `"x.`+strings.Repeat("a", i+1)+`": "1"`)
	}
	in := `{"runners": [{"image": "runner-python:latest", "labels": {` + strings.Join(labels, ",") + `}}]}`
	if _, err := Parse(strings.NewReader(in)); err == nil || !strings.Contains(err.Error(), "more than") {
		t.Fatalf("%d labels: %v", len(labels), err)
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "runners.json")
	if err := os.WriteFile(path, []byte(`{"runners": [`+python+`]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if l, err := Load(path); err != nil || len(l) != 1 {
		t.Fatalf("Load = %v, %v", l, err)
	}
	if _, err := Load(filepath.Join(dir, "missing.json")); err == nil || !strings.Contains(err.Error(), "runner list") {
		t.Fatalf("Load(missing) = %v", err)
	}
}
