package api

import (
	"flag"
	"os"
	"testing"

	"github.com/pb33f/libopenapi"
	validator "github.com/pb33f/libopenapi-validator"

	"github.com/runbox-dev/runbox/internal/testenv"
)

var update = flag.Bool("update", false, "write docs/openapi.yaml and the generated client anew")

// docFile is the document in the repository, for readers and generators.
const docFile = "../../docs/openapi.yaml"

// testDocument builds the document of every route New registers.
func testDocument(t *testing.T) *document {
	t.Helper()
	d, err := newDocument(new(Server).routes())
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestDocument checks the document with a validator that is not its
// generator (pb33f/libopenapi-validator, against OpenAPI 3.1's own
// schema), and that docs/openapi.yaml is what the server serves.
func TestDocument(t *testing.T) {
	d := testDocument(t)
	doc, err := libopenapi.NewDocument(d.json)
	if err != nil {
		t.Fatal(err)
	}
	v, errs := validator.NewValidator(doc)
	if len(errs) > 0 {
		t.Fatalf("the document does not build: %v", errs)
	}
	if ok, verrs := v.ValidateDocument(); !ok {
		for _, e := range verrs {
			t.Errorf("%s: %s", e.Message, e.Reason)
			for _, se := range e.SchemaValidationErrors {
				t.Errorf("  %s at %s", se.Reason, se.FieldPath)
			}
		}
	}
	yaml, err := d.spec.MarshalYAML()
	if err != nil {
		t.Fatal(err)
	}
	if *update {
		if err := os.WriteFile(docFile, yaml, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	committed, err := os.ReadFile(docFile)
	if err != nil {
		t.Fatal(err)
	}
	if string(committed) != string(yaml) {
		t.Errorf("%s is not the document the server serves: run go generate ./internal/api", docFile)
	}
}

// clientDir holds the generated client and oapi-codegen's configuration.
const clientDir = "apiclient"

// TestGeneratedClient generates the client from docs/openapi.yaml as `go
// generate` does, and fails when the committed one differs: a route that
// changed without a new client fails here, and the end-to-end test drives
// the API through the client.
func TestGeneratedClient(t *testing.T) {
	testenv.GeneratedClient(t, docFile, clientDir, "go generate ./internal/api", *update)
}
