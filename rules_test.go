package runbox

import (
	"bytes"
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

// The shape of the code is held by these tests rather than by hand: which
// packages speak to which outside system, that an adapter knows only the
// root, its seam and the few shared packages named below (never another
// adapter), that configuration reads values without knowing the parts that
// use them, and that no function grows past what a reader takes in at
// once. docs/architecture.md ("The rules") says why. They read the code
// that ships: tests may look at an outside system directly, since what
// happened there is what they assert.

const module = "github.com/runbox-dev/runbox"

// pkg is what go list says of a package of the module, its path relative
// to the module ("" for the root).
type pkg struct {
	ImportPath string
	Dir        string
	GoFiles    []string
	Imports    []string
}

// modulePackages lists the module's packages once for the tests below.
var modulePackages = sync.OnceValues(func() ([]pkg, error) {
	out, err := exec.Command("go", "list", "-json", "./...").Output()
	if err != nil {
		return nil, err
	}
	var pkgs []pkg
	for dec := json.NewDecoder(bytes.NewReader(out)); dec.More(); {
		var p pkg
		if err := dec.Decode(&p); err != nil {
			return nil, err
		}
		p.ImportPath = strings.TrimPrefix(strings.TrimPrefix(p.ImportPath, module), "/")
		pkgs = append(pkgs, p)
	}
	return pkgs, nil
})

func packages(t *testing.T) []pkg {
	t.Helper()
	pkgs, err := modulePackages()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	return pkgs
}

// ours returns the module's packages p imports, by their paths relative to
// the module ("" for the root).
func (p pkg) ours() []string {
	var out []string
	for _, imp := range p.Imports {
		if imp == module {
			out = append(out, "")
		} else if rel, ok := strings.CutPrefix(imp, module+"/"); ok {
			out = append(out, rel)
		}
	}
	return out
}

// within reports whether the package path is one of dirs or below one.
func within(path string, dirs ...string) bool {
	return slices.ContainsFunc(dirs, func(d string) bool { return path == d || strings.HasPrefix(path, d+"/") })
}

// outsideSystems are the client libraries of the systems runbox speaks
// to, and the packages that may import each (those below them too): the
// adapter that speaks to the system, and where named, why another may.
var outsideSystems = []struct {
	system  string
	imports []string // import path prefixes
	in      []string
	why     string
}{
	{"the Docker Engine API", []string{"github.com/moby/moby/", "github.com/docker/docker/"}, []string{"internal/sandbox/docker"},
		"the Docker engine, and its tests' helper below it (dockertest). The rule is about the Engine's API, whose types " +
			"would otherwise spread: github.com/moby/sys/mountinfo (files: is a folder a mount point?) and " +
			"github.com/docker/go-units (sizes such as 512m) are small libraries of moby's that speak to no Docker"},
	{"Redis (go-redis)", []string{"github.com/redis/go-redis/", "github.com/go-redis/"}, []string{"internal/store", "internal/testenv"},
		"store holds every Redis operation; testenv, which tests alone import (TestTestSupport), waits for the " +
			"redis-server it starts and hands tests a raw client to look at what store wrote"},
	{"asynq", []string{"github.com/hibiken/asynq"}, []string{"internal/queue", "internal/app"},
		"queue; app reads REDIS_URL with asynq's own parser, so that runbox and asynq read it alike"},
	{"S3 (minio)", []string{"github.com/minio/minio-go/"}, []string{"internal/s3store"}, "the remote file store"},
	{"Kubernetes (client-go)", []string{"k8s.io/"}, []string{"internal/sandbox/kubernetes"}, "the Kubernetes engine"},
}

// TestOutsideSystems: each outside system's client library is imported by
// its adapter alone, and where the table says why, by one more.
func TestOutsideSystems(t *testing.T) {
	for _, p := range packages(t) {
		for _, imp := range p.Imports {
			for _, sys := range outsideSystems {
				if slices.ContainsFunc(sys.imports, func(pre string) bool { return strings.HasPrefix(imp+"/", pre) }) &&
					!within(p.ImportPath, sys.in...) {
					t.Errorf("%s imports %s (%s): only %s may: %s", p.ImportPath, imp, sys.system, strings.Join(sys.in, ", "), sys.why)
				}
			}
		}
	}
}

// adapters are the packages that speak to an outside system, or stand for
// one behind a seam, with the module's packages each may import besides
// the root (where most seams and the domain's words are) and its own
// sub-packages.
var adapters = []adapter{
	{"internal/store", nil, "Redis; its consumers declare what they use"},
	{"internal/queue", nil, "asynq; its consumers declare what they use"},
	{"internal/sandbox/docker", []string{"internal/sandbox/engine", "internal/agent"},
		"an engine: engine is its seam's words, agent the protocol its sandboxes' agent speaks (its Landlock bound)"},
	{"internal/sandbox/kubernetes", []string{"internal/sandbox/engine", "internal/agent", "internal/sparse"},
		"an engine: as docker, and sparse to copy files in and out of pods with their holes"},
	{"internal/s3store", nil, "S3, behind runbox.FileStore"},
	{"internal/gitexport", []string{"internal/mcp", "internal/runs", "internal/auth", "internal/audit"},
		"the forges; a tool family as well, which registers its tools (mcp), reads a run's files (runs), " +
			"knows its caller (auth) and records each push first (audit)"},
	{"internal/webhooks", []string{"internal/egress", "internal/lifecycle", "internal/sessions"},
		"clients' receivers: where a callback may go is egress's policy, its workers are lifecycle services, " +
			"and a session's id is redacted as sessions does"},
}

type adapter struct {
	path string
	may  []string // module packages
	why  string
}

// adapterOf returns the adapter path is, or is below; nil if none.
func adapterOf(path string) *adapter {
	for i := range adapters {
		if within(path, adapters[i].path) {
			return &adapters[i]
		}
	}
	return nil
}

// TestAdapters: an adapter imports of the module the root, its own
// sub-packages and what the table names for it — never another adapter;
// no package but app and the commands imports more than one adapter.
func TestAdapters(t *testing.T) {
	for _, a := range adapters {
		for _, m := range a.may {
			if adapterOf(m) != nil {
				t.Errorf("the table lets the adapter %s import %s, an adapter", a.path, m)
			}
		}
	}
	for _, p := range packages(t) {
		own := adapterOf(p.ImportPath)
		var used []string
		for _, imp := range p.ours() {
			if a := adapterOf(imp); a != nil && a != own && !slices.Contains(used, a.path) {
				used = append(used, a.path)
			}
			if own != nil && imp != "" && !within(imp, own.path) && !slices.Contains(own.may, imp) {
				t.Errorf("the adapter %s imports %s: it may import the root, its own packages and %v (%s)",
					p.ImportPath, imp, own.may, own.why)
			}
		}
		if len(used) > 1 && !within(p.ImportPath, "internal/app", "cmd") {
			t.Errorf("%s imports the adapters %s: only app wires more than one", p.ImportPath, strings.Join(used, ", "))
		}
	}
}

// TestConfigKnowsNoPart: config reads the environment into values and
// checks them; the parts that use a value parse and check what is theirs
// (app.Load calls them), so config imports nothing of the module but the
// root.
func TestConfigKnowsNoPart(t *testing.T) {
	for _, p := range packages(t) {
		if p.ImportPath != "internal/config" {
			continue
		}
		for _, imp := range p.ours() {
			if imp != "" {
				t.Errorf("internal/config imports %s: it reads values; each part checks its own options", imp)
			}
		}
	}
}

// TestEngineNameIsReadOnce: outside config, which reads SANDBOX_ENGINE,
// no code compares an engine's name. app opens the engine the name gives
// (its engines table), then asks the engine what it can do
// (engine.Capabilities): a third engine then needs a line in the table,
// not a hunt for the places that switch features on the name.
func TestEngineNameIsReadOnce(t *testing.T) {
	isEngine := func(e ast.Expr) bool {
		s, ok := e.(*ast.SelectorExpr)
		return ok && s.Sel.Name == "Engine"
	}
	isString := func(e ast.Expr) bool {
		l, ok := e.(*ast.BasicLit)
		return ok && l.Kind == token.STRING
	}
	fset := token.NewFileSet()
	for _, p := range packages(t) {
		if p.ImportPath == "internal/config" {
			continue
		}
		for _, name := range p.GoFiles {
			f, err := parser.ParseFile(fset, filepath.Join(p.Dir, name), nil, parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			ast.Inspect(f, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.BinaryExpr:
					if (n.Op == token.EQL || n.Op == token.NEQ) &&
						(isEngine(n.X) && isString(n.Y) || isString(n.X) && isEngine(n.Y)) {
						t.Errorf("%s: compares an engine's name; ask the engine (Capabilities)", fset.Position(n.Pos()))
					}
				case *ast.SwitchStmt:
					if n.Tag != nil && isEngine(n.Tag) {
						t.Errorf("%s: switches on an engine's name; ask the engine (Capabilities)", fset.Position(n.Pos()))
					}
				}
				return true
			})
		}
	}
}

// testSupport are packages for tests, which may do what shipped code must
// not (testenv imports go-redis).
var testSupport = []string{"internal/testenv", "internal/sandbox/docker/dockertest", "internal/sparse/sparsetest"}

// TestTestSupport: tests alone import the packages for tests.
func TestTestSupport(t *testing.T) {
	for _, p := range packages(t) {
		for _, imp := range p.ours() {
			if within(imp, testSupport...) && !within(p.ImportPath, testSupport...) {
				t.Errorf("%s imports %s, a package for tests", p.ImportPath, imp)
			}
		}
	}
}

// maxFuncLines bounds a function, as a reader takes it in at once.
const maxFuncLines = 80

// TestFunctionLength: no function outside cmd/bench, tests and generated
// code passes maxFuncLines lines.
func TestFunctionLength(t *testing.T) {
	fset := token.NewFileSet()
	for _, p := range packages(t) {
		if within(p.ImportPath, "cmd/bench") {
			continue
		}
		for _, name := range p.GoFiles {
			f, err := parser.ParseFile(fset, filepath.Join(p.Dir, name), nil, parser.ParseComments|parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			if ast.IsGenerated(f) {
				continue
			}
			for _, d := range f.Decls {
				fn, ok := d.(*ast.FuncDecl)
				if !ok || fn.Body == nil {
					continue
				}
				if n := fset.Position(fn.End()).Line - fset.Position(fn.Pos()).Line + 1; n > maxFuncLines {
					t.Errorf("%s: %s is %d lines; at most %d", fset.Position(fn.Pos()), fn.Name.Name, n, maxFuncLines)
				}
			}
		}
	}
}
