package e2b

import (
	"flag"
	"os"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/runbox-dev/runbox/internal/testenv"
)

//go:generate go test -run ^TestGeneratedClient$ . -args -update

var update = flag.Bool("update", false, "rewrite the generated client")

const (
	docFile   = "../../docs/e2b-openapi.yaml"
	clientDir = "e2bclient"
)

// TestGeneratedClient: e2bclient is what oapi-codegen makes of the
// document (go generate ./internal/e2b rewrites it).
func TestGeneratedClient(t *testing.T) {
	testenv.GeneratedClient(t, docFile, clientDir, "go generate ./internal/e2b", *update)
}

// TestDocumentRoutes: the document names every route of the control
// plane, and no other.
func TestDocumentRoutes(t *testing.T) {
	raw, err := os.ReadFile(docFile)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Paths map[string]map[string]any `yaml:"paths"`
	}
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	var documented, served []string
	for path, ops := range doc.Paths {
		for method := range ops {
			if method != "parameters" {
				documented = append(documented, strings.ToUpper(method)+" "+path)
			}
		}
	}
	for _, r := range (&Handler{}).controlRoutes() {
		served = append(served, r.pattern)
	}
	slices.Sort(documented)
	slices.Sort(served)
	if !slices.Equal(documented, served) {
		t.Errorf("documented %v\nserved %v", documented, served)
	}
}
