// Package runnerlist reads the runner images an executor offers from a
// file (SANDBOX_RUNNERS_FILE) rather than from its engine.
//
// The Docker engine finds the runner images by their labels in the
// Docker Engine that runs the sandboxes. A Kubernetes cluster has no such
// question: no API lists the images its nodes hold with their labels, and
// an executor in the cluster has no Docker Engine to ask. So the build
// that makes the runner images writes what a Docker Engine would have
// answered — each image's reference and labels — into a file
// (deploy/runners-list.sh), which deploy/build.sh bakes into the runbox
// image beside the executor; a deployment that pulls its runners from a
// registry points SANDBOX_RUNNERS_FILE at a file of its own (a ConfigMap)
// naming them there, by digest if it likes. A file, not a setting of
// language=image pairs, because the labels carry more than the image (the
// language's version, a template's port, the exec tmpfs's size), and the
// list then stays the images' own, made by the build that made them.
//
// The file is read as hostile: bounded in size and entries, every image
// reference parsed, every label checked, unknown fields refused. The
// sandbox manager then applies to its images the checks it applies to a
// Docker Engine's.
package runnerlist

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/distribution/reference"

	"github.com/runbox-dev/runbox/internal/sandbox"
	"github.com/runbox-dev/runbox/internal/sandbox/engine"
)

// Bounds of a runner list: far above the dozen or so runners runbox
// builds, far below what would cost an executor memory.
const (
	MaxBytes     = 1 << 20
	MaxRunners   = 256
	MaxLabels    = 64
	maxLabelKey  = 128
	maxLabelText = 1024
	// maxImage: a name of 255 (the grammar's bound), a tag and a digest.
	maxImage = 512
)

// File is a runner list as it is written.
type File struct {
	Runners []Runner `json:"runners"`
}

// Runner is one runner image: its reference, as the sandboxes' pods name
// it (runner-python:latest, or registry.example/runner-python@sha256:…),
// and its labels (sandbox.runner=true, sandbox.language or
// sandbox.template, …).
type Runner struct {
	Image  string            `json:"image"`
	Labels map[string]string `json:"labels"`
}

// List is the runner images of a file, as an engine lists images.
type List []engine.Image

// Load reads and checks the runner list at path.
func Load(path string) (List, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("runner list: %w", err)
	}
	defer f.Close()
	l, err := Parse(f)
	if err != nil {
		return nil, fmt.Errorf("runner list %s: %w", path, err)
	}
	return l, nil
}

// Parse reads and checks a runner list.
func Parse(r io.Reader) (List, error) {
	b, err := io.ReadAll(io.LimitReader(r, MaxBytes+1))
	if err != nil {
		return nil, err
	}
	if len(b) > MaxBytes {
		return nil, fmt.Errorf("larger than %d bytes", MaxBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var f File
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("not a runner list: %w", err)
	}
	if dec.More() {
		return nil, errors.New("not a runner list: more than one JSON value")
	}
	if len(f.Runners) == 0 {
		return nil, errors.New("no runner")
	}
	if len(f.Runners) > MaxRunners {
		return nil, fmt.Errorf("more than %d runners", MaxRunners)
	}
	seen := map[string]bool{}
	out := make(List, 0, len(f.Runners))
	for i, rn := range f.Runners {
		if err := rn.check(); err != nil {
			return nil, fmt.Errorf("runner %d: %w", i+1, err)
		}
		if seen[rn.Image] {
			return nil, fmt.Errorf("runner %d: %s is listed twice", i+1, rn.Image)
		}
		seen[rn.Image] = true
		out = append(out, engine.Image{Tags: []string{rn.Image}, Labels: rn.Labels})
	}
	return out, nil
}

// check says what is wrong with a runner, if anything.
func (r Runner) check() error {
	if err := checkImage(r.Image); err != nil {
		return err
	}
	if len(r.Labels) > MaxLabels {
		return fmt.Errorf("%s: more than %d labels", r.Image, MaxLabels)
	}
	for k, v := range r.Labels {
		if len(k) > maxLabelKey || !labelKey.MatchString(k) {
			return fmt.Errorf("%s: label %q: not a label's name", r.Image, k)
		}
		if len(v) > maxLabelText || !printable(v) {
			return fmt.Errorf("%s: label %s: a value of at most %d printable bytes", r.Image, k, maxLabelText)
		}
	}
	if r.Labels[sandbox.LabelRunner] != "true" {
		return fmt.Errorf("%s: no label %s=true", r.Image, sandbox.LabelRunner)
	}
	lang, tpl := r.Labels[sandbox.LabelLanguage], r.Labels[sandbox.LabelTemplate]
	switch {
	case (lang == "") == (tpl == ""):
		return fmt.Errorf("%s: exactly one of the labels %s and %s", r.Image, sandbox.LabelLanguage, sandbox.LabelTemplate)
	case lang != "" && !name.MatchString(lang), tpl != "" && !name.MatchString(tpl):
		return fmt.Errorf("%s: a language's or template's name is lower-case letters, digits and '-', at most 32", r.Image)
	}
	return nil
}

// checkImage accepts a reference a pod can name: a repository with a tag,
// a digest or both, in the canonical grammar (no upper case), with no
// white space or control character that the grammar would not already
// refuse.
func checkImage(s string) error {
	if len(s) > maxImage {
		return fmt.Errorf("image %q: not an image reference", s)
	}
	ref, err := reference.ParseNormalizedNamed(s)
	if err != nil {
		return fmt.Errorf("image %q: %w", s, err)
	}
	_, tagged := ref.(reference.Tagged)
	_, digested := ref.(reference.Digested)
	if !tagged && !digested {
		return fmt.Errorf("image %q: name a tag or a digest (runner-python:latest)", s)
	}
	return nil
}

var (
	// labelKey is a Docker label's name as runbox's images use them
	// (reverse-DNS, lower case).
	labelKey = regexp.MustCompile(`^[a-z0-9]([a-z0-9._-]*[a-z0-9])?$`)
	// name is a language's or template's: it names images and pods.
	name = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$`)
)

// printable: valid UTF-8 without control characters (a label's value
// reaches logs and clients: the language's version).
func printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	return !strings.ContainsFunc(s, unicode.IsControl)
}

// Images returns the runners that carry label, key=value (or key alone:
// any value), as an engine's image listing does.
func (l List) Images(_ context.Context, label string) ([]engine.Image, error) {
	k, v, exact := strings.Cut(label, "=")
	var out []engine.Image
	for _, img := range l {
		got, ok := img.Labels[k]
		if ok && (!exact || got == v) {
			out = append(out, img)
		}
	}
	return out, nil
}
