package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// TestPlayground drives the playground page in headless Chromium as a
// person would: paste the token, upload a CSV, load it with "keep state"
// on, chart it in the next run and see the chart inline, type into a
// program's input, stop a run that would last a minute. It saves a
// screenshot under the test's temp dir.
func TestPlayground(t *testing.T) {
	path, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatal("chromium is not installed (apt-get install chromium): the browser test needs it")
	}
	s := start(t, options{})
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.WindowSize(1400, 1000),
		chromedp.Flag("disable-background-networking", true))
	actx, cancel := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancel()
	tab, cancel := chromedp.NewContext(actx)
	defer cancel()
	// The first call starts the browser, which lives as long as that
	// call's context: no deadline on it.
	if err := chromedp.Do(tab, chromedp.Navigate(s.url+"/")); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(tab, 3*time.Minute)
	defer cancel()

	csv := filepath.Join(t.TempDir(), "sales.csv")
	if err := os.WriteFile(csv, []byte("month,sales\n1,10\n2,14\n3,9\n4,20\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	status := func(text string) chromedp.Action[chromedp.Void] {
		return chromedp.WaitVisible(chromedp.Search(`//span[@id="status" and starts-with(text(), "` + text + `")]`))
	}
	runCell := func(code string) chromedp.Action[chromedp.Void] {
		return chromedp.Steps(
			chromedp.SetValue(chromedp.ID("code"), code),
			chromedp.Click(chromedp.ID("run")),
			status("done"),
		)
	}
	steps := []struct {
		name string
		do   chromedp.Action[chromedp.Void]
	}{
		{"open", chromedp.Steps(
			chromedp.WaitVisible(chromedp.ID("run")),
			chromedp.SendKeys(chromedp.ID("token"), token),
		)},
		{"upload", chromedp.Steps(
			chromedp.SetUploadFiles(chromedp.ID("pick"), []string{csv}),
			status("uploaded sales.csv"),
			chromedp.WaitVisible(chromedp.Search(`//ul[@id="files"]//a[text()="sales.csv"]`)),
		)},
		{"keep state: load", chromedp.Steps(
			chromedp.Click(chromedp.ID("keep")),
			runCell("import pandas as pd\ndf = pd.read_csv('sales.csv')\nprint('rows', len(df))"),
			chromedp.WaitVisible(chromedp.Search(`//pre[@id="output" and contains(., "rows 4")]`)),
		)},
		{"keep state: chart", chromedp.Steps(
			runCell("import matplotlib.pyplot as plt\ndf.plot(x='month', y='sales')\nplt.show()\ndf['sales'].sum()"),
			chromedp.WaitVisible(chromedp.Search(`//pre[@id="output" and contains(., "53")]`)),
			chromedp.WaitVisible(chromedp.Search(`//div[@id="images"]/img[@alt="figure_1.png"]`)),
		)},
	}
	for _, st := range steps {
		if err := chromedp.Do(ctx, st.do); err != nil {
			t.Fatalf("%s: %v; the page says %s", st.name, err, pageState(tab))
		}
	}
	// The chart is rendered: the browser loaded and decoded the PNG.
	width, err := chromedp.Run(ctx, chromedp.Poll[int](`(() => { const i = document.querySelector('#images img'); return i && i.complete && i.naturalWidth; })()`))
	if err != nil || width < 100 {
		t.Fatalf("chart not rendered: width %d, %v", width, err)
	}
	shot, err := chromedp.Run(ctx, chromedp.FullScreenshot(100)) // quality 100: a PNG
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "playground.png")
	if err := os.WriteFile(file, shot, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s (%d bytes)", file, len(shot))

	// Interactive input, then Stop.
	err = chromedp.Do(ctx,
		chromedp.Click(chromedp.ID("interactive")),
		chromedp.SetValue(chromedp.ID("code"), "name = input('who? ')\nprint('hello', name)"),
		chromedp.Click(chromedp.ID("run")),
		chromedp.WaitVisible(chromedp.ID("stdin")),
		chromedp.SendKeys(chromedp.ID("stdin"), "ada"),
		chromedp.Click(chromedp.ID("send")),
		status("done"),
		chromedp.WaitVisible(chromedp.Search(`//pre[@id="output" and contains(., "hello ada")]`)),
		chromedp.Click(chromedp.ID("interactive")),
		chromedp.SetValue(chromedp.ID("code"), "import time\nprint('waiting', flush=True)\ntime.sleep(60)"),
		chromedp.Click(chromedp.ID("run")),
		chromedp.WaitVisible(chromedp.Search(`//pre[@id="output" and contains(., "waiting")]`)),
		chromedp.Click(chromedp.ID("stop")),
		status("cancelled"),
		// The kept state outlived the stopped cell.
		runCell("len(df)"),
		chromedp.WaitVisible(chromedp.Search(`//pre[@id="output" and contains(., "4")]`)),
	)
	if err != nil {
		t.Fatalf("%v; the page says %s", err, pageState(tab))
	}
	statusText, err := chromedp.Run(ctx, chromedp.Text(chromedp.ID("status")))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(statusText, "lost") {
		t.Errorf("status after stop: %q", statusText)
	}
}

// pageState returns the status and output the page shows, for a failure's
// message.
func pageState(tab context.Context) string {
	ctx, cancel := context.WithTimeout(tab, 10*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[string](`"status: " + document.getElementById("status").textContent + "; output: " + document.getElementById("output").textContent`))
	if err != nil {
		return err.Error()
	}
	return fmt.Sprintf("%q", v)
}
