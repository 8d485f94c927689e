package e2e

import (
	"context"
	"encoding/base64"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// sandboxOutput reads get_sandbox_output until its output has want, or
// fails.
func sandboxOutput(t *testing.T, cs *mcp.ClientSession, id, typ, want string) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var out struct {
			Output string `json:"output"`
		}
		res := call(t, cs, "get_sandbox_output", map[string]any{"sandbox_id": id, "output_type": typ}, &out)
		if res.IsError {
			t.Fatalf("get_sandbox_output %s: %s", typ, text(res))
		}
		if strings.Contains(out.Output, want) {
			return out.Output
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never showed %q: %q", typ, want, out.Output)
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// TestReactProject drives the gateway's project tools as its clients do,
// and looks at the app in headless Chromium: the rendered component, the
// change write_files_to_sandbox makes (the page reloads itself), a
// syntax error in build_output, the dev server's log in console_log with
// a planted secret redacted.
func TestReactProject(t *testing.T) {
	path, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatal("chromium is not installed (apt-get install chromium): the browser test needs it")
	}
	s := start(t, options{})
	cs := s.session(nil)

	var te struct {
		Error     string   `json:"error"`
		Available []string `json:"available"`
	}
	if res := call(t, cs, "create_sandbox_for_project", map[string]any{"project_name": "nope", "template": "next"}, &te); !res.IsError ||
		te.Error != "template_unavailable" || !strings.Contains(strings.Join(te.Available, ","), "react") {
		t.Errorf("next: %s", text(res))
	}

	var created struct {
		SandboxID  string `json:"sandbox_id"`
		PreviewURL string `json:"preview_url"`
	}
	res := call(t, cs, "create_sandbox_for_project", map[string]any{
		"project_name": "e2e-react", "template": "react",
		"initial_files": map[string]any{
			"src/App.jsx": "export default function App() { return <h1>Hello from the e2e project</h1>; }\n",
		},
	}, &created)
	if res.IsError {
		t.Fatalf("create_sandbox_for_project: %s", text(res))
	}

	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("disable-background-networking", true))
	actx, cancel := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancel()
	tab, cancel := chromedp.NewContext(actx)
	defer cancel()
	// Chromium resolves every name under localhost to the loopback: the
	// preview URL reaches the api's port as a host of its own.
	if err := chromedp.Do(tab, chromedp.Navigate(created.PreviewURL)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(tab, 2*time.Minute)
	defer cancel()
	heading := func(text string) chromedp.Action[chromedp.Void] {
		return chromedp.WaitVisible(chromedp.Search(`//h1[contains(., "` + text + `")]`))
	}
	if err := chromedp.Do(ctx, heading("Hello from the e2e project")); err != nil {
		t.Fatalf("the rendered app: %v", err)
	}

	var written struct {
		Success bool `json:"success"`
	}
	res = call(t, cs, "write_files_to_sandbox", map[string]any{"sandbox_id": created.SandboxID, "files": map[string]any{
		"src/App.jsx": "export default function App() { return <h1>Changed by write_files_to_sandbox</h1>; }\n",
	}}, &written)
	if res.IsError || !written.Success {
		t.Fatalf("write_files_to_sandbox: %s", text(res))
	}
	// The dev server rebuilt and the page reloaded itself.
	if err := chromedp.Do(ctx, heading("Changed by write_files_to_sandbox")); err != nil {
		t.Fatalf("the changed app: %v", err)
	}

	call(t, cs, "write_files_to_sandbox", map[string]any{"sandbox_id": created.SandboxID, "files": map[string]any{
		"src/App.jsx": "export default function App() { return <h1>broken</h1>;; ) }\n",
	}}, nil)
	sandboxOutput(t, cs, created.SandboxID, "build_output", "[ERROR]")

	const planted = "sk-e2eplantedsecret0123456789"
	if err := chromedp.Do(ctx, chromedp.Navigate(created.PreviewURL+"?api_key="+planted)); err != nil {
		t.Fatal(err)
	}
	log := sandboxOutput(t, cs, created.SandboxID, "console_log", "api_key=[REDACTED]")
	if strings.Contains(log, planted) || !strings.Contains(log, "dev server listening") {
		t.Errorf("console_log: %q", log)
	}
	var u struct {
		Output string `json:"output"`
	}
	call(t, cs, "get_sandbox_output", map[string]any{"sandbox_id": created.SandboxID, "output_type": "preview_url"}, &u)
	if code, _ := s.browse(t, u.Output, nil); code != 200 {
		t.Errorf("get_sandbox_output preview_url: %q answers %d", u.Output, code)
	}
}

// TestNodeProjectEntry: the node template runs the project's own entry
// when the client brings one — the gateway's clients send index.js, in
// its record form of files — and the template's server.js otherwise:
// package.json's start script first, then its main, then index.js. The
// project starts again each time write_files_to_sandbox changes it (Node
// 18's own watch mode saw the first change only).
func TestNodeProjectEntry(t *testing.T) {
	s := start(t, options{})
	cs := s.session(nil)
	server := func(says string) string {
		return `require('node:http').createServer((req, res) => res.end(` + "`" + says + "`" + `)).listen(process.env.PORT || 3000);` + "\n"
	}
	// body waits until the preview answers with want.
	body := func(t *testing.T, previewURL, want string) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for {
			code, got := s.browse(t, previewURL, nil)
			if code == 200 && got == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s answers %d %q, want %q", previewURL, code, got, want)
			}
			time.Sleep(300 * time.Millisecond)
		}
	}
	for _, tt := range []struct {
		name  string
		files map[string]any
		want  string
	}{
		{"index.js, as the gateway's clients send it", map[string]any{"index.js": server("from index.js")}, "from index.js"},
		{"package.json's start script", map[string]any{
			"package.json": `{"scripts": {"start": "node app.js"}, "main": "index.js"}`,
			"app.js":       server("from the start script"), "index.js": server("from index.js"),
		}, "from the start script"},
		{"package.json's main", map[string]any{
			"package.json": `{"main": "src/main.js"}`, "src/main.js": server("from main"), "index.js": server("from index.js"),
		}, "from main"},
		{"nothing of its own: the template's server.js", nil, "<!doctype html><title>node</title><h1>Hello from Node.js</h1>\n"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			args := map[string]any{"project_name": "entry", "template": "node"}
			if tt.files != nil {
				args["initial_files"] = tt.files
			}
			var created struct {
				SandboxID  string `json:"sandbox_id"`
				PreviewURL string `json:"preview_url"`
			}
			if res := call(t, cs, "create_sandbox_for_project", args, &created); res.IsError {
				t.Fatalf("create_sandbox_for_project: %s", text(res))
			}
			defer call(t, cs, "close_session", map[string]any{"conversationId": created.SandboxID}, nil)
			body(t, created.PreviewURL, tt.want)
			if tt.name != "index.js, as the gateway's clients send it" {
				return
			}
			// The entry restarts with its change, written in either form.
			for i, files := range []any{
				map[string]any{"index.js": server("changed once")},
				[]map[string]any{{"path": "index.js", "content": base64.StdEncoding.EncodeToString([]byte(server("changed twice"))), "encoding": "base64"}},
			} {
				var written struct {
					Success bool `json:"success"`
				}
				if res := call(t, cs, "write_files_to_sandbox", map[string]any{"sandbox_id": created.SandboxID, "files": files}, &written); res.IsError || !written.Success {
					t.Fatalf("write_files_to_sandbox: %s", text(res))
				}
				body(t, created.PreviewURL, []string{"changed once", "changed twice"}[i])
			}
			sandboxOutput(t, cs, created.SandboxID, "build_output", "starting the project (index.js)")
		})
	}
}
