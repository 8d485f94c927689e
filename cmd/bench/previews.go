package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/runbox-dev/runbox/internal/bench"
)

// previewRows measures previews against the same requests straight to a
// container of the same image (its port published on the loopback): a
// 10 KB page, a WebSocket echo, and a react project from its creation to
// the first page through its preview URL.
func previewRows(ctx context.Context, svc *service, cs *mcp.ClientSession, n int) ([]row, error) {
	api := strings.TrimPrefix(svc.url, "http://")
	via := bench.Via(api)
	page, err := previewPageRow(ctx, cs, via, n)
	if err != nil {
		return nil, err
	}
	echo, err := previewEchoRow(ctx, cs, api, n)
	if err != nil {
		return nil, err
	}
	project, err := projectRow(ctx, cs, via)
	if err != nil {
		return nil, err
	}
	return []row{page, echo, project}, nil
}

// previewPageRow measures GETs of a 10 KB page through a preview (via:
// the client that reaches the api) and straight to a container.
func previewPageRow(ctx context.Context, cs *mcp.ClientSession, via *http.Client, n int) (row, error) {
	log.Print("preview: GET of a 10 KB page, through the preview URL and straight to a container")
	page := bench.PythonPageServer(10 << 10)
	u, err := backgroundPreview(ctx, cs, "python", "bench-preview", page, 8000)
	if err != nil {
		return row{}, err
	}
	through, err := bench.Gets(ctx, via, u, 20, n)
	if err != nil {
		return row{}, err
	}
	direct, err := publishedTimes(ctx, "runner-python", 8000, "", func(p *bench.Published) ([]time.Duration, error) {
		c := bench.Via(p.Addr)
		if err := firstOK(ctx, c, "http://"+p.Addr+"/"); err != nil {
			return nil, err
		}
		return bench.Gets(ctx, c, "http://"+p.Addr+"/", 20, n)
	}, "python3", "-c", page)
	if err != nil {
		return row{}, err
	}
	t, d := bench.Summarize(through), bench.Summarize(direct)
	return row{
		measure:  "preview `GET /` of a 10 KB page (Python `http.server`, keep-alive), sequential",
		result:   pair(t),
		baseline: "straight to the container " + ms(d.Median),
		ratio:    ratio(t.Median, d.Median),
		target:   "≤ direct + 5 ms p50",
		met:      t.Median-d.Median <= 5*time.Millisecond,
	}, nil
}

// previewEchoRow measures a WebSocket echo's round trip through a
// preview (api is the api's address) and straight to a container.
func previewEchoRow(ctx context.Context, cs *mcp.ClientSession, api string, n int) (row, error) {
	log.Print("preview: WebSocket echo round trip")
	u, err := backgroundPreview(ctx, cs, "typescript", "bench-ws", bench.NodeEchoServer, 3000)
	if err != nil {
		return row{}, err
	}
	through, err := bench.Echoes(strings.Replace(u, "http://", "ws://", 1)+"echo", api, 50, 4*n)
	if err != nil {
		return row{}, err
	}
	dir, err := os.MkdirTemp("", "runbox-bench-ws-")
	if err != nil {
		return row{}, err
	}
	defer os.RemoveAll(dir)
	os.Chmod(dir, 0o777)
	if err := os.WriteFile(filepath.Join(dir, "server.ts"), []byte(bench.NodeEchoServer), 0o644); err != nil {
		return row{}, err
	}
	direct, err := publishedTimes(ctx, "runner-typescript", 3000, dir, func(p *bench.Published) ([]time.Duration, error) {
		if err := firstOK(ctx, bench.Via(p.Addr), "http://"+p.Addr+"/"); err != nil {
			return nil, err
		}
		return bench.Echoes("ws://"+p.Addr+"/echo", p.Addr, 50, 4*n)
	}, "/opt/runbox/run-typescript", "/data/server.ts")
	if err != nil {
		return row{}, err
	}
	t, d := bench.Summarize(through), bench.Summarize(direct)
	return row{
		measure:  "preview WebSocket echo round trip (32 bytes), one connection",
		result:   pair(t),
		baseline: "straight to the container " + ms(d.Median),
		ratio:    ratio(t.Median, d.Median),
		target:   "≤ direct + 2 ms p50",
		met:      t.Median-d.Median <= 2*time.Millisecond,
	}, nil
}

// projectRow measures create_sandbox_for_project (react) to its first page
// through its preview (via: the client that reaches the api), beside
// `docker run` of the template to its first page.
func projectRow(ctx context.Context, cs *mcp.ClientSession, via *http.Client) (row, error) {
	log.Print("preview: create_sandbox_for_project (react) to the first page")
	var created, started []time.Duration
	for range 3 {
		start := time.Now()
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "create_sandbox_for_project", Arguments: map[string]any{
			"project_name": "bench", "template": "react"}})
		if err != nil {
			return row{}, err
		}
		var p struct {
			PreviewURL string `json:"preview_url"`
		}
		b, _ := json.Marshal(res.StructuredContent)
		if res.IsError || json.Unmarshal(b, &p) != nil {
			return row{}, fmt.Errorf("create_sandbox_for_project: %s", b)
		}
		if err := firstOK(ctx, via, p.PreviewURL); err != nil {
			return row{}, err
		}
		created = append(created, time.Since(start))

		start = time.Now()
		pub, err := bench.Publish(ctx, "runner-template-react:"+runnerTag(), 3000, "", "/opt/runbox/template/start")
		if err != nil {
			return row{}, err
		}
		err = firstOK(ctx, bench.Via(pub.Addr), "http://"+pub.Addr+"/")
		pub.Remove()
		if err != nil {
			return row{}, err
		}
		started = append(started, time.Since(start))
	}
	t, d := bench.Summarize(created), bench.Summarize(started)
	return row{
		measure:  "`create_sandbox_for_project` (react) → first successful preview `GET /`",
		result:   pair(t),
		baseline: "`docker run` of the template → first `GET /` " + ms(d.Median),
		ratio:    ratio(t.Median, d.Median),
		target:   "measured",
		met:      true,
	}, nil
}

// onlyPreviews starts the service and measures previews alone.
func onlyPreviews(ctx context.Context, binDir string, n int) ([]row, error) {
	return onService(ctx, binDir, func(svc *service, cs *mcp.ClientSession) ([]row, error) {
		return previewRows(ctx, svc, cs, n)
	})
}

// backgroundPreview starts a server with run_code background: true and
// returns a preview URL once its port listens.
func backgroundPreview(ctx context.Context, cs *mcp.ClientSession, lang, conv, code string, port int) (string, error) {
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_code", Arguments: map[string]any{
		"language": lang, "code": code, "conversationId": conv, "background": true}})
	if err != nil {
		return "", err
	}
	if res.IsError {
		b, _ := json.Marshal(res.StructuredContent)
		return "", fmt.Errorf("background run_code: %s", b)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "get_preview_url", Arguments: map[string]any{
			"conversationId": conv, "port": port}})
		if err != nil {
			return "", err
		}
		var u struct {
			URL string `json:"url"`
		}
		b, _ := json.Marshal(res.StructuredContent)
		if !res.IsError && json.Unmarshal(b, &u) == nil {
			return u.URL, nil
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("get_preview_url: %s", b)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// publishedTimes runs image's server (entrypoint and args) with port
// published on the loopback and dataDir (if not empty) at /data, hands it
// to measure, and removes it.
func publishedTimes(ctx context.Context, image string, port int, dataDir string, measure func(*bench.Published) ([]time.Duration, error),
	entrypoint string, args ...string) ([]time.Duration, error) {
	p, err := bench.Publish(ctx, image+":"+runnerTag(), port, dataDir, entrypoint, args...)
	if err != nil {
		return nil, err
	}
	defer p.Remove()
	return measure(p)
}

// firstOK waits up to a minute for url to answer 200.
func firstOK(ctx context.Context, c *http.Client, url string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return bench.FirstOK(ctx, c, url)
}
