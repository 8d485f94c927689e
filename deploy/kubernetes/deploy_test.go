package kubernetes

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/runbox-dev/runbox/internal/testenv"
)

// The test overlay's (test/secret.env).
const testToken = "k8s-test-token-0123456789"

// images are what the manifests run, built by deploy/build.sh kubernetes,
// and the runners the test's runs need: bash (which an executor starts a
// sandbox of at start, its runtime check) and python. The executors'
// list names every runner built; their pool is off (test/settings.env),
// so that they start none of the others, which the cluster lacks.
var images = []string{"runbox:latest", "runbox-redis:latest", "runbox-versitygw:latest", "runner-bash:latest", "runner-python:latest"}

// TestDeploy deploys runbox into the cluster as an operator would: the
// images built here and imported, the test overlay applied, and the api
// used through its Service, with Redis and the file store behind it, and
// the executors running code in sandbox pods beside themselves.
func TestDeploy(t *testing.T) {
	c := testenv.Kubernetes(t)
	build := exec.Command("../build.sh", "kubernetes")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		t.Fatalf("deploy/build.sh kubernetes: %v", err)
	}
	for _, image := range images {
		c.ImportImage(t, image)
	}
	deploy(t, c)

	api := "http://" + strings.TrimSpace(c.Kubectl(t, "get", "service", "-n", namespace, "api", "-o", "jsonpath={.spec.clusterIP}"))
	// Redis, the store and an executor answer.
	waitService(t, api)
	var ready map[string]string
	if call(t, api, "GET", "/readyz", "", nil, &ready); ready["redis"] != "ok" || ready["files"] != "ok" || ready["executors"] != "ok" {
		t.Fatalf("/readyz: %v; want redis, files and executors ok", ready)
	}
	var doc struct {
		OpenAPI string         `json:"openapi"`
		Paths   map[string]any `json:"paths"`
	}
	if code := call(t, api, "GET", "/openapi.json", "", nil, &doc); code != http.StatusOK || !strings.HasPrefix(doc.OpenAPI, "3.1") || doc.Paths["/v1/runs"] == nil {
		t.Fatalf("/openapi.json: %d, openapi %q, %d paths", code, doc.OpenAPI, len(doc.Paths))
	}
	if code := call(t, api, "GET", "/v1/runs", "", nil, nil); code != http.StatusUnauthorized {
		t.Errorf("/v1/runs without a token: %d; want 401", code)
	}
	var runs struct {
		Runs []any `json:"runs"`
	}
	if code := call(t, api, "GET", "/v1/runs", testToken, nil, &runs); code != http.StatusOK || len(runs.Runs) != 0 {
		t.Errorf("/v1/runs: %d %+v; want 200 and none", code, runs)
	}
	// A file through the api into versitygw and back.
	if code := call(t, api, "PUT", "/v1/conversations/k8s/files/hello.txt", testToken, strings.NewReader("hello from the cluster"), nil); code != http.StatusCreated {
		t.Fatalf("upload: %d; want 201", code)
	}
	var body string
	if code := call(t, api, "GET", "/v1/conversations/k8s/files/hello.txt", testToken, nil, &body); code != http.StatusOK || body != "hello from the cluster" {
		t.Errorf("the file read back: %d %q", code, body)
	}

	// A run: the executor makes a sandbox pod of the runner its list
	// names, and the program's output and files come back.
	var res struct {
		Success bool   `json:"success"`
		Stdout  string `json:"stdout"`
		Stderr  string `json:"stderr"`
		Files   []struct {
			Name string `json:"name"`
		} `json:"files"`
	}
	code := "open('out.txt', 'w').write('from a pod')\nprint(sum(range(10)))"
	req, _ := json.Marshal(map[string]any{"language": "python", "code": code, "conversationId": "k8s"})
	if st := call(t, api, "POST", "/v1/runs?wait=true", testToken, strings.NewReader(string(req)), &res); st != http.StatusOK ||
		!res.Success || res.Stdout != "45\n" || len(res.Files) != 2 {
		t.Fatalf("a run through the Service: %d %+v; want 45 and two files", st, res)
	}
	if code := call(t, api, "GET", "/v1/conversations/k8s/files/out.txt", testToken, nil, &body); code != http.StatusOK || body != "from a pod" {
		t.Errorf("the run's file: %d %q", code, body)
	}
	if pods := c.Kubectl(t, "get", "pods", "-n", sandboxes, "-l", "runbox.sandbox=true", "-o", "name"); strings.TrimSpace(pods) == "" {
		t.Errorf("no sandbox pod in %s", sandboxes)
	}

	// Redis and the store answer the api (above) and the executors alone:
	// not a sandbox, nor another pod of the api's namespace.
	for _, svc := range []string{"redis", "versitygw"} {
		ip := strings.TrimSpace(c.Kubectl(t, "get", "service", "-n", namespace, svc, "-o", "jsonpath={.spec.clusterIP}"))
		port := strings.TrimSpace(c.Kubectl(t, "get", "service", "-n", namespace, svc, "-o", "jsonpath={.spec.ports[0].port}"))
		for _, p := range []struct {
			ns, name, labels string
			open             bool
		}{
			{sandboxes, "as-executor", "{app.kubernetes.io/name: executor}", true},
			{sandboxes, "sandbox", "{runbox.sandbox: \"true\"}", false},
			{namespace, "neighbour", "{}", false},
		} {
			probePod(t, c, p.ns, p.name, p.labels)
			waitReach(t, c, p.ns, p.name, ip, port, p.open)
		}
	}
}

// probePod starts a pod of the runbox image that sleeps, to probe from.
func probePod(t *testing.T, c *testenv.Cluster, ns, name, labels string) {
	t.Helper()
	if _, err := c.KubectlInput(nil, "get", "pod", "-n", ns, name); err == nil {
		return
	}
	c.Apply(t, fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: %s, labels: %s}
spec:
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 0
  securityContext:
    runAsNonRoot: true
    runAsUser: 65532
    seccompProfile: {type: RuntimeDefault}
  containers:
  - name: main
    image: runbox:latest
    imagePullPolicy: Never
    command: [sleep, infinity]
    securityContext:
      allowPrivilegeEscalation: false
      readOnlyRootFilesystem: true
      capabilities: {drop: [ALL]}
`, name, ns, labels))
	c.Kubectl(t, "wait", "-n", ns, "--for=condition=Ready", "pod/"+name, "--timeout=2m")
}

// waitReach probes ip:port from the pod until the answer is open's.
func waitReach(t *testing.T, c *testenv.Cluster, ns, name, ip, port string, open bool) {
	t.Helper()
	probe := `timeout 3 bash -c '</dev/tcp/$0/$1' "$0" "$1" 2>/dev/null && echo open || echo closed`
	want := map[bool]string{true: "open", false: "closed"}[open]
	if got := execUntil(t, c, ns, name, want, "bash", "-c", probe, ip, port); got != want {
		t.Fatalf("%s/%s reaching %s:%s: %q; want %s", ns, name, ip, port, got, want)
	}
}

// execUntil runs command in the pod until its output starts with want,
// for up to two minutes (kube-router writes a new pod's rules only once
// the pod has its address), and returns the last output. The probes give
// up after 3 s, so an exec still running after 30 s is stuck: it is
// killed, logged and tried again, and never holds the package.
func execUntil(t *testing.T, c *testenv.Cluster, ns, name, want string, command ...string) string {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		out, err := c.KubectlContext(ctx, nil, append([]string{"exec", "-n", ns, name, "--"}, command...)...)
		cancel()
		if err != nil {
			t.Log(err)
		} else if strings.HasPrefix(out, want) {
			return strings.TrimSpace(out)
		}
		if time.Now().After(deadline) {
			return strings.TrimSpace(out)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// deploy applies the test overlay and waits until Redis, versitygw and
// the api are ready; the deployment goes when the test ends.
func deploy(t *testing.T, c *testenv.Cluster) {
	t.Helper()
	t.Cleanup(func() {
		if t.Failed() {
			for _, ns := range []string{namespace, sandboxes} {
				out, _ := c.KubectlInput(nil, "get", "pods,events", "-n", ns, "-o", "wide")
				t.Logf("namespace %s:\n%s", ns, out)
			}
			out, _ := c.KubectlInput(nil, "logs", "-n", namespace, "deployment/api", "--tail=40")
			t.Logf("the api's log:\n%s", out)
		}
		// Waiting, so that the package's other tests find no namespace
		// being deleted.
		if _, err := c.KubectlInput(nil, "delete", "-k", "test", "--wait", "--timeout=3m"); err != nil {
			t.Errorf("remove the deployment: %v", err)
		}
	})
	c.Kubectl(t, "apply", "-k", "test")
	for _, w := range []string{"statefulset/redis", "statefulset/versitygw", "deployment/api"} {
		c.Kubectl(t, "rollout", "status", "-n", namespace, w, "--timeout=3m")
	}
	c.Kubectl(t, "rollout", "status", "-n", sandboxes, "deployment/executor", "--timeout=3m")
}

// waitService waits up to a minute for the api's Service to take
// connections: kube-proxy writes its rules for the api's endpoint a moment
// after the rollout is complete, and refuses connections until then.
func waitService(t *testing.T, api string) {
	t.Helper()
	client := &http.Client{Timeout: 10 * time.Second}
	deadline := time.Now().Add(time.Minute)
	for {
		resp, err := client.Get(api + "/healthz")
		if err == nil {
			resp.Body.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the api's Service: %v", err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// call makes a request of the api and returns its status, decoding a
// JSON answer into out (a *string takes the body as it is).
func call(t *testing.T, api, method, path, token string, body io.Reader, out any) int {
	t.Helper()
	req, err := http.NewRequest(method, api+path, body)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	client := &http.Client{Timeout: 30 * time.Second}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	switch out := out.(type) {
	case nil:
	case *string:
		*out = string(b)
	default:
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s %s: %d %s: %v", method, path, resp.StatusCode, b, err)
		}
	}
	if resp.StatusCode >= 400 {
		t.Logf("%s %s: %d %s", method, path, resp.StatusCode, b)
	}
	return resp.StatusCode
}
