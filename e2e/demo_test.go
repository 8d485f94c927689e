package e2e

import (
	"bytes"
	"context"
	"image/png"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/runbox-dev/runbox/examples/marketing/demo"
)

// TestMarketingDemo runs examples/marketing against the real service.
func TestMarketingDemo(t *testing.T) {
	s := start(t, options{})
	cs := s.session(nil)
	var csv bytes.Buffer
	if err := demo.GenerateCSV(&csv, 2025); err != nil {
		t.Fatal(err)
	}
	if rows := bytes.Count(csv.Bytes(), []byte("\n")); rows < 2000 {
		t.Fatalf("%d rows of data", rows)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	rep, err := demo.Run(ctx, cs, csv.Bytes(), http.DefaultClient, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	first, fixed := rep.Steps[0], rep.Steps[1]
	if first.Success || !strings.Contains(first.Stderr, "KeyError") {
		t.Errorf("the first attempt: success %v, stderr %q; want a KeyError", first.Success, first.Stderr)
	}
	if !fixed.Success || !strings.Contains(fixed.Stdout, "2920 rows") {
		t.Errorf("the retry: %+v", fixed)
	}
	if len(rep.Charts) != 3 {
		t.Errorf("charts %v", rep.Charts)
	}
	if rep.ChartMIME != "image/png" {
		t.Errorf("read_file of a chart gave %s", rep.ChartMIME)
	}
	if _, err := png.Decode(bytes.NewReader(rep.Chart)); err != nil {
		t.Errorf("the chart is not a valid PNG: %v", err)
	}
	if !bytes.HasPrefix(rep.PDF, []byte("%PDF")) {
		t.Fatalf("the report starts with %q", rep.PDF[:min(8, len(rep.PDF))])
	}
	if pages, images := demo.PDFPages(rep.PDF), demo.PDFImages(rep.PDF); pages < 2 || images < 3 {
		t.Errorf("the report has %d pages and %d images; want the table and the three charts", pages, images)
	}
}
