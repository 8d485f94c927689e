package e2e

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// TestPlayground drives the playground page in headless Chromium: a user
// pastes the token, runs code, sees its output stream in and the file it
// wrote listed with a link.
func TestPlayground(t *testing.T) {
	path, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatal("chromium is not installed (apt-get install chromium): the browser test needs it")
	}
	s := start(t, options{})
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("disable-background-networking", true))
	actx, cancel := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancel()
	ctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	ctx, cancel = context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()

	err = chromedp.Do(ctx,
		chromedp.Navigate(s.url+"/"),
		chromedp.WaitVisible(chromedp.ID("run")),
		chromedp.SendKeys(chromedp.ID("token"), token),
		chromedp.SetValue(chromedp.ID("code"), "import time\nprint('hello from the playground')\ntime.sleep(1)\nopen('out.txt', 'w').write('x')"),
		chromedp.Click(chromedp.ID("run")),
		chromedp.WaitVisible(chromedp.Search(`//pre[@id="output" and contains(., "hello from the playground")]`)),
		chromedp.WaitVisible(chromedp.Search(`//span[@id="status" and text()="done"]`)),
	)
	if err != nil {
		t.Fatal(err)
	}
	text := func(id string) string {
		v, err := chromedp.Run(ctx, chromedp.Text(chromedp.ID(id)))
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	status, output, files := text("status"), text("output"), text("files")
	if !strings.Contains(output, "hello from the playground") || !strings.Contains(files, "out.txt") || !strings.Contains(files, "new") {
		t.Errorf("status %q, output %q, files %q", status, output, files)
	}
}
