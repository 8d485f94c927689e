package sandbox

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/runbox-dev/runbox"
)

// TestTemplates: the images labelled sandbox.template are the project
// templates, not languages; a template's run starts its dev server,
// which a stream reaches, in a sandbox bounded as a project's; the
// conversation's sandboxes are listed while it runs and not after.
func TestTemplates(t *testing.T) {
	m, docker := newManager(t, Limits{Memory: 1 << 30, NanoCPUs: 1e9, Pids: 128})
	ctx := context.Background()
	langs, err := m.Discover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range langs {
		if strings.HasPrefix(l.Language, "@") || l.Language == "" {
			t.Errorf("a template listed as a language: %+v", l)
		}
	}
	tpls := map[string]runbox.Template{}
	for _, tp := range m.Templates() {
		tpls[tp.Name] = tp
	}
	for _, name := range []string{"node", "react", "vue"} {
		if tp := tpls[name]; tp.Port != 3000 || !strings.HasPrefix(tp.Image, "runner-template-"+name+":") {
			t.Fatalf("template %s: %+v (make images builds it)", name, tp)
		}
	}

	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan Outcome, 1)
	go func() {
		oc, _ := m.Run(runCtx, Request{RunID: "tpl", ConversationID: "project", Language: TemplateKey("node"),
			Code: "exec /opt/runbox/template/start\n", Timeout: 5 * time.Minute, DataDir: dataDir(t)}, func(Stream, []byte) {})
		done <- oc
	}()
	deadline := time.Now().Add(60 * time.Second)
	for {
		if yes, _ := m.Listening(ctx, "project", 3000); yes {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the node template's server never listened")
		}
		time.Sleep(100 * time.Millisecond)
	}
	ids := m.Sandboxes("project")
	if len(ids) != 1 {
		t.Fatalf("sandboxes of the project while it runs: %v", ids)
	}
	info, err := docker.ContainerInspect(ctx, ids[0], client.ContainerInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if r := info.Container.HostConfig.Resources; r.Memory != TemplateMemory || r.NanoCPUs != TemplateNanoCPUs {
		t.Errorf("a project's sandbox: memory %d, CPUs %d", r.Memory, r.NanoCPUs)
	}
	c, err := m.DialPort(ctx, "project", 3000)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprint(c, "GET / HTTP/1.0\r\nHost: x\r\n\r\n")
	b, _ := io.ReadAll(c)
	c.Close()
	if !strings.Contains(string(b), "Hello from Node.js") || !strings.HasPrefix(string(b), "HTTP/1.1 "+fmt.Sprint(http.StatusOK)) {
		t.Errorf("the template's page: %q", b)
	}
	cancel()
	<-done
	if ids := m.Sandboxes("project"); len(ids) != 0 {
		t.Errorf("sandboxes after the run was cancelled: %v", ids)
	}
}
