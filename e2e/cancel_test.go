package e2e

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestClientGoneCancelsRun: a run_code whose caller goes away (its
// context cancelled: the SDK sends notifications/cancelled and closes the
// request) ends cancelled within a second, and its program stops.
func TestClientGoneCancelsRun(t *testing.T) {
	s := start(t, options{})
	for _, transport := range []string{"streamable", "sse"} {
		t.Run(transport, func(t *testing.T) {
			cs := s.session(nil)
			if transport == "sse" {
				cs = s.sseSession()
			}
			cid := "gone-" + transport
			ctx, cancel := context.WithCancel(context.Background())
			errc := make(chan error, 1)
			go func() {
				_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_code", Arguments: map[string]any{
					"language": "bash", "conversationId": cid,
					"code": "for i in $(seq 100); do echo $i >> /data/ticks.txt; sleep 0.1; done"}})
				errc <- err
			}()
			// Wait for the run to be running.
			var runID string
			waitFor(t, func() bool {
				var out struct {
					Runs []struct {
						RunID  string `json:"run_id"`
						Status string `json:"status"`
					} `json:"runs"`
				}
				call(t, cs, "list_runs", map[string]any{"conversationId": cid}, &out)
				if len(out.Runs) > 0 && out.Runs[0].Status == "running" {
					runID = out.Runs[0].RunID
					return true
				}
				return false
			})
			time.Sleep(300 * time.Millisecond)
			cancel()
			<-errc
			gone := time.Now()
			var p progress
			for time.Since(gone) < 5*time.Second {
				call(t, cs, "get_run", map[string]any{"run_id": runID}, &p)
				if p.Status != "running" {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			took := time.Since(gone)
			if p.Status != "cancelled" {
				t.Fatalf("run after its caller went: %s", p.Status)
			}
			t.Logf("cancelled %v after the caller went", took)
			if took > 3*time.Second { // the goal is 1 s; a generous bound for a loaded machine
				t.Errorf("cancelled %v after the caller went", took)
			}
			res := runCode(t, cs, map[string]any{"language": "bash", "conversationId": cid,
				"code": "a=$(wc -l < /data/ticks.txt); sleep 1; b=$(wc -l < /data/ticks.txt); [ $a = $b ] && echo stopped"})
			if !strings.Contains(res.Stdout, "stopped") {
				t.Errorf("the program went on: %+v", res)
			}
		})
	}
}

// TestKeyedRunOutlivesItsStream: a run_code with an idempotency_key whose
// HTTP stream closes (a dropped connection looks the same) goes on, and
// the client's retry with the key gets its whole result — not a run
// cancelled by the first call's going, nor the code run twice.
func TestKeyedRunOutlivesItsStream(t *testing.T) {
	s := start(t, options{})
	cs := s.session(nil)
	args := map[string]any{"language": "bash", "conversationId": "keyed", "idempotency_key": "k-1",
		"code": "echo start >> /data/log; sleep 2; echo end >> /data/log; cat /data/log"}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_code", Arguments: args})
		errc <- err
	}()
	waitFor(t, func() bool {
		var out struct {
			Runs []struct {
				Status string `json:"status"`
			} `json:"runs"`
		}
		call(t, cs, "list_runs", map[string]any{"conversationId": "keyed"}, &out)
		return len(out.Runs) > 0 && out.Runs[0].Status == "running"
	})
	cancel()
	<-errc
	res := runCode(t, cs, args)
	if !res.Success || res.Stdout != "start\nend\n" {
		t.Errorf("the retry with the key: %+v; want the first call's run, run once to its end", res)
	}
}

// sseSession connects the official client over the legacy HTTP+SSE
// transport.
func (s *service) sseSession() *mcp.ClientSession {
	s.t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "e2e-sse", Version: "1"}, nil)
	cs, err := c.Connect(context.Background(), &mcp.SSEClientTransport{
		Endpoint: s.url + "/mcp/events", HTTPClient: &http.Client{Transport: bearer{Token: token}},
	}, nil)
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { cs.Close() })
	return cs
}

// TestHeartbeats: a run_code with a progress token hears from the server
// at least every 5 s while its run is silent, so that a client whose
// timeout progress resets (the TypeScript SDK's resetTimeoutOnProgress)
// keeps waiting: here a client timeout of 8 s, reset by every progress
// notification, and a 20 s silent run that completes.
func TestHeartbeats(t *testing.T) {
	s := start(t, options{})
	const clientTimeout = 8 * time.Second
	progressed := make(chan struct{}, 64)
	cs := s.session(&mcp.ClientOptions{ProgressNotificationHandler: func(context.Context, *mcp.ProgressNotificationClientRequest) {
		select {
		case progressed <- struct{}{}:
		default:
		}
	}})
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	var beats atomic.Int32
	go func() {
		timer := time.NewTimer(clientTimeout)
		defer timer.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-progressed:
				beats.Add(1)
				timer.Reset(clientTimeout)
			case <-timer.C:
				cancel(errors.New("the client timed out: no progress for 8 s"))
				return
			}
		}
	}()
	params := &mcp.CallToolParams{Name: "run_code", Arguments: map[string]any{"language": "bash", "code": "sleep 20; echo done"}}
	params.SetProgressToken("hb")
	res, err := cs.CallTool(ctx, params)
	if err != nil {
		t.Fatalf("run_code: %v (%v)", err, context.Cause(ctx))
	}
	if res.IsError || !strings.Contains(text(res), "done") {
		t.Fatalf("run_code: %s", text(res))
	}
	cancel(nil)
	t.Logf("%d progress notifications during a 20 s silent run", beats.Load())
}
