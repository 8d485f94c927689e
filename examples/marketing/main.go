// Command marketing runs the marketing analysis demo against a running
// runbox: it uploads a year of campaign data, analyses it (fixing its own
// first mistake), draws charts, writes a PDF report, looks at a chart and
// downloads the report into -out.
//
//	go run ./examples/marketing -url http://localhost:8080 -token <token>
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"log"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/runbox-dev/runbox/examples/marketing/demo"
)

func main() {
	url := flag.String("url", "http://localhost:8080", "runbox base URL")
	token := flag.String("token", os.Getenv("MCP_API_TOKEN"), "API token (default $MCP_API_TOKEN)")
	out := flag.String("out", ".", "folder for report.pdf and the chart")
	flag.Parse()
	if err := run(*url, *token, *out); err != nil {
		log.Fatal(err)
	}
}

type bearer string

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+string(b))
	return http.DefaultTransport.RoundTrip(r)
}

func run(url, token, out string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	client := mcp.NewClient(&mcp.Implementation{Name: "marketing-demo", Version: "1"}, nil)
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{
		Endpoint: url + "/mcp", HTTPClient: &http.Client{Transport: bearer(token)},
	}, nil)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer cs.Close()
	var csv bytes.Buffer
	if err := demo.GenerateCSV(&csv, 2025); err != nil {
		return err
	}
	rep, err := demo.Run(ctx, cs, csv.Bytes(), http.DefaultClient, func(f string, a ...any) { log.Printf(f, a...) })
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(out, "report.pdf"), rep.PDF, 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(out, rep.Charts[0]), rep.Chart, 0o644); err != nil {
		return err
	}
	log.Printf("wrote %s and %s", filepath.Join(out, "report.pdf"), filepath.Join(out, rep.Charts[0]))
	return nil
}
