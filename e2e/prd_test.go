package e2e

import (
	"context"
	"encoding/base64"
	"os/exec"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestPRDWorkflow replays the Python sandbox PRD's workflow over stdio with
// the PRD's own field names, as a client written to it would.
func TestPRDWorkflow(t *testing.T) {
	s := start(t, options{})
	cmd := exec.Command(bin.api, "--stdio")
	cmd.Env = s.env
	var stderr syncBuffer
	cmd.Stderr = &stderr
	c := mcp.NewClient(&mcp.Implementation{Name: "prd-client", Version: "1"}, nil)
	cs, err := c.Connect(context.Background(), &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	defer func() {
		if t.Failed() {
			t.Logf("api --stdio said:\n%s", stderr.String())
		}
	}()
	structured := func(res *mcp.CallToolResult) map[string]any {
		var m map[string]any
		_ = jsonUnmarshal(text(res), &m)
		if m == nil {
			b, _ := jsonMarshal(res.StructuredContent)
			_ = jsonUnmarshal(string(b), &m)
		}
		return m
	}

	// Upload without a session: one is made and returned, with the PRD's path.
	csv := "region,amount\nnorth,10\nsouth,32\n"
	res := call(t, cs, "upload_file", map[string]any{"filename": "sales.csv", "content_base64": base64.StdEncoding.EncodeToString([]byte(csv))}, nil)
	up := structured(res)
	sid, _ := up["session_id"].(string)
	if res.IsError || !strings.HasPrefix(sid, "sess_") || up["path"] != "/mnt/data/sales.csv" || up["filename"] != "sales.csv" || up["download_url"] == "" {
		t.Fatalf("upload_file: %s", text(res))
	}
	if up["conversationId"] != sid || up["name"] != "sales.csv" || up["url"] != up["download_url"] {
		t.Errorf("upload_file lacks runbox's names: %v", up)
	}

	// A run that fails with KeyError, then the fixed one.
	res = call(t, cs, "run_python", map[string]any{"session_id": sid,
		"code": "import pandas as pd\ndf = pd.read_csv('/mnt/data/sales.csv')\nprint(df['revenue'].sum())"}, nil)
	bad := structured(res)
	if bad["exit_code"] != float64(1) || !strings.Contains(bad["stderr"].(string), "KeyError") || len(bad["artifacts"].([]any)) != 0 {
		t.Errorf("failing run: %s", text(res))
	}
	if _, runboxShape := bad["success"]; runboxShape {
		t.Errorf("run_python answered in runbox's shape: %s", text(res))
	}
	res = call(t, cs, "run_python", map[string]any{"session_id": sid, "code": `import pandas as pd
import matplotlib.pyplot as plt
df = pd.read_csv('/mnt/data/sales.csv')
print(df['amount'].sum())
df.plot.bar(x='region', y='amount')
plt.savefig('/mnt/data/chart.png')`}, nil)
	good := structured(res)
	if good["exit_code"] != float64(0) || strings.TrimSpace(good["stdout"].(string)) != "42" || good["session_id"] != sid {
		t.Fatalf("fixed run: %s", text(res))
	}
	arts := good["artifacts"].([]any)
	if len(arts) != 1 {
		t.Fatalf("artifacts: %v", arts)
	}
	chart := arts[0].(map[string]any)
	if chart["path"] != "/mnt/data/chart.png" || chart["filename"] != "chart.png" || chart["mime_type"] != "image/png" || chart["download_url"] == "" {
		t.Errorf("chart artifact: %v", chart)
	}

	// read_artifact and list_artifacts.
	res = call(t, cs, "read_artifact", map[string]any{"session_id": sid, "path": "/mnt/data/chart.png"}, nil)
	ra := structured(res)
	data, _ := base64.StdEncoding.DecodeString(ra["content_base64"].(string))
	if ra["path"] != "/mnt/data/chart.png" || ra["mime_type"] != "image/png" || len(data) < 100 || string(data[1:4]) != "PNG" {
		t.Errorf("read_artifact: %v", ra["path"])
	}
	res = call(t, cs, "read_artifact", map[string]any{"session_id": sid, "path": "/mnt/data/missing.png"}, nil)
	if m := structured(res); !res.IsError || m["error"] != "not_found" || m["message"] != "No artifact at /mnt/data/missing.png" {
		t.Errorf("read_artifact of a missing file: %s", text(res))
	}
	res = call(t, cs, "list_artifacts", map[string]any{"session_id": sid}, nil)
	list := structured(res)["artifacts"].([]any)
	if len(list) != 2 || list[0].(map[string]any)["path"] != "/mnt/data/chart.png" {
		t.Errorf("list_artifacts: %s", text(res))
	}

	// close_session twice: closed, then session_not_found.
	res = call(t, cs, "close_session", map[string]any{"session_id": sid}, nil)
	if m := structured(res); res.IsError || m["status"] != "closed" || m["session_id"] != sid {
		t.Errorf("close_session: %s", text(res))
	}
	res = call(t, cs, "close_session", map[string]any{"session_id": sid}, nil)
	if m := structured(res); !res.IsError || m["error"] != "session_not_found" || m["message"] != "No active session with id "+sid {
		t.Errorf("second close_session: %s", text(res))
	}
}
