package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/bench"
)

// service is the runbox under test.
type service struct {
	url, token string
	// metrics are the /metrics addresses of the standalone executors.
	metrics []string
	root    string
	procs   map[string]*exec.Cmd
	logs    map[string]*bytes.Buffer
	stopped bool
}

type serviceOptions struct {
	executors int
	// s3 keeps the files in an S3 server (versitygw) started here, each
	// executor with a SANDBOX_ROOT of its own.
	s3 bool
	// env is more settings for every process.
	env []string
	// runtime is SANDBOX_RUNTIME; "" the engine's default.
	runtime string
}

func startService(binDir string, o serviceOptions) (*service, error) {
	for _, b := range []string{"api", "executor"} {
		if _, err := os.Stat(filepath.Join(binDir, b)); err != nil {
			return nil, fmt.Errorf("%s/%s is missing: run make build", binDir, b)
		}
	}
	root, err := os.MkdirTemp("", "runbox-bench-root-")
	if err != nil {
		return nil, err
	}
	s := &service{token: "bench-" + rand.Text(), root: root, procs: map[string]*exec.Cmd{}, logs: map[string]*bytes.Buffer{}}
	redisPort, apiPort := freePort(), freePort()
	s.url = fmt.Sprintf("http://127.0.0.1:%d", apiPort)
	redis := exec.Command("redis-server", "--port", strconv.Itoa(redisPort), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
	if err := s.start("redis", redis); err != nil {
		return nil, fmt.Errorf("start redis-server (apt-get install redis-server): %w", err)
	}
	env := append(os.Environ(),
		fmt.Sprintf("REDIS_URL=redis://127.0.0.1:%d/0", redisPort),
		"MCP_HTTP_ADDR="+fmt.Sprintf("127.0.0.1:%d", apiPort),
		"PUBLIC_BASE_URL="+s.url,
		"MCP_API_TOKEN="+s.token,
		"SANDBOX_ROOT="+root,
		"LOG_LEVEL=warn",
		"SANDBOX_RUNTIME="+o.runtime,
		// The batches' row queues 1000 runs in 16 conversations at once.
		fmt.Sprintf("SANDBOX_MAX_QUEUED_PER_CONVERSATION=%d", runbox.MaxBatchRuns/batchConversations+1),
	)
	env = append(env, o.env...)
	if o.s3 {
		s3env, err := s.startS3()
		if err != nil {
			s.stop()
			return nil, err
		}
		env = append(env, s3env...)
	}
	for i := range o.executors {
		if err := s.startExecutor(binDir, i, env, o.s3); err != nil {
			s.stop()
			return nil, err
		}
	}
	cmd := exec.Command(filepath.Join(binDir, "api"))
	cmd.Env = env
	if err := s.start("api", cmd); err != nil {
		s.stop()
		return nil, err
	}
	if err := s.waitReady(60 * time.Second); err != nil {
		return nil, err
	}
	return s, nil
}

// startS3 starts the S3 server the files are kept in (versitygw), and
// returns the settings that name it.
func (s *service) startS3() ([]string, error) {
	s3Addr := fmt.Sprintf("127.0.0.1:%d", freePort())
	gw := exec.Command(versitygw(), "--access", "bench", "--secret", "bench-secret-key", "--port",
		s3Addr, "posix", filepath.Join(s.root, "s3"))
	os.MkdirAll(filepath.Join(s.root, "s3"), 0o700)
	if err := s.start("versitygw", gw); err != nil {
		return nil, fmt.Errorf("start versitygw (make test-deps): %w", err)
	}
	for range 100 { // every process opens the bucket at start
		if c, err := net.Dial("tcp", s3Addr); err == nil {
			c.Close()
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	return []string{"FILE_STORE=s3://runbox-bench", "AWS_ENDPOINT_URL=http://" + s3Addr,
		"AWS_ACCESS_KEY_ID=bench", "AWS_SECRET_ACCESS_KEY=bench-secret-key"}, nil
}

// startExecutor starts executor-i with env; with s3, it has a
// SANDBOX_ROOT of its own.
func (s *service) startExecutor(binDir string, i int, env []string, s3 bool) error {
	name := fmt.Sprintf("executor-%d", i)
	cmd := exec.Command(filepath.Join(binDir, "executor"))
	metrics := fmt.Sprintf("127.0.0.1:%d", freePort())
	s.metrics = append(s.metrics, "http://"+metrics+"/metrics")
	cmd.Env = append(env, "EXECUTOR_ID=bench-"+strings.ToLower(rand.Text()[:8]), "EXECUTOR_METRICS_ADDR="+metrics)
	if s3 {
		dir := filepath.Join(s.root, name)
		os.MkdirAll(dir, 0o711)
		cmd.Env = append(cmd.Env, "SANDBOX_ROOT="+dir)
	}
	return s.start(name, cmd)
}

// waitReady waits until api answers /readyz, at most d; past it, the
// service is stopped and the error carries the processes' logs.
func (s *service) waitReady(d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		resp, err := http.Get(s.url + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			s.stop()
			var logs strings.Builder
			for name, l := range s.logs {
				fmt.Fprintf(&logs, "--- %s ---\n%s", name, l.String())
			}
			return fmt.Errorf("the service did not become ready:\n%s", logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// settle waits until the executors have started the sandboxes their pools
// begin with and the machine is idle again (under a quarter of its CPU
// busy for two seconds), at most a minute and a half: a measure taken
// meanwhile would share the CPU with container starts — under gVisor
// seconds of CPU each, well after the container count is reached.
func (s *service) settle() {
	quiet := 0
	prevBusy, prevTotal := cpuTimes()
	for deadline := time.Now().Add(90 * time.Second); time.Now().Before(deadline) && quiet < 2; {
		time.Sleep(time.Second)
		busy, total := cpuTimes()
		if total > prevTotal && float64(busy-prevBusy) < 0.25*float64(total-prevTotal) {
			quiet++
		} else {
			quiet = 0
		}
		prevBusy, prevTotal = busy, total
	}
}

// cpuTimes returns the host's busy and total CPU time so far, in ticks
// (the first line of /proc/stat).
func cpuTimes() (busy, total uint64) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	for i, f := range strings.Fields(line)[1:] {
		n, _ := strconv.ParseUint(f, 10, 64)
		total += n
		if i != 3 && i != 4 { // idle, iowait
			busy += n
		}
	}
	return busy, total
}

func (s *service) start(name string, cmd *exec.Cmd) error {
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	if err := cmd.Start(); err != nil {
		return err
	}
	s.procs[name], s.logs[name] = cmd, &buf
	return nil
}

func (s *service) stop() {
	if s.stopped {
		return
	}
	s.stopped = true
	for _, name := range []string{"api", "executor-0", "executor-1", "redis", "versitygw"} {
		if cmd := s.procs[name]; cmd != nil {
			_ = cmd.Process.Signal(os.Interrupt)
			done := make(chan struct{})
			go func() { cmd.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(60 * time.Second):
				cmd.Process.Kill()
			}
		}
	}
	unmountUnder(s.root)
	os.RemoveAll(s.root)
}

// cpu returns the share of one core api, executor and redis-server used
// together over d.
func (s *service) cpu(d time.Duration) float64 {
	return s.cpuOf(d)
}

// cpuOf returns the share of one core the processes named used together
// over d; every process of the service if none is named.
func (s *service) cpuOf(d time.Duration, names ...string) float64 {
	total := func() time.Duration {
		var t time.Duration
		for name, cmd := range s.procs {
			if len(names) == 0 || slices.Contains(names, name) {
				t += cpuTime(cmd.Process.Pid)
			}
		}
		return t
	}
	before := total()
	time.Sleep(d)
	return float64(total()-before) / float64(d)
}

// cpuTime reads the user and system time a process has used from
// /proc/<pid>/stat (in clock ticks of 10 ms).
func cpuTime(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// Fields after the command name, which ends at the last ')'.
	fields := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(fields) < 13 {
		return 0
	}
	utime, _ := strconv.ParseInt(fields[11], 10, 64)
	stime, _ := strconv.ParseInt(fields[12], 10, 64)
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// sampleRSS samples the resident memory of api and executor until the
// returned function is called, which returns the peaks.
func (s *service) sampleRSS() func() map[string]int64 {
	peak := map[string]int64{}
	var mu sync.Mutex
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			for _, name := range []string{"api", "executor-0"} {
				if v := rss(s.procs[name].Process.Pid); v > 0 {
					mu.Lock()
					peak[name] = max(peak[name], v)
					mu.Unlock()
				}
			}
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	}()
	return func() map[string]int64 {
		close(stop)
		<-done
		return peak
	}
}

// rss reads a process's resident set size from /proc.
func rss(pid int) int64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}

func unmountUnder(dir string) {
	b, _ := os.ReadFile("/proc/self/mountinfo")
	for line := range strings.SplitSeq(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			_ = exec.Command("umount", f[4]).Run()
		}
	}
}

func freePort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// versitygw finds the S3 server make test-deps installs.
func versitygw() string {
	if p, err := exec.LookPath("versitygw"); err == nil {
		return p
	}
	gopath, _ := exec.Command("go", "env", "GOPATH").Output()
	return filepath.Join(strings.TrimSpace(string(gopath)), "bin", "versitygw")
}

// startSession starts a service and connects an MCP client to it.
func startSession(ctx context.Context, binDir string, o serviceOptions) (*service, *mcp.ClientSession, error) {
	svc, err := startService(binDir, o)
	if err != nil {
		return nil, nil, err
	}
	cs, err := bench.Client{URL: svc.url, Token: svc.token}.Session(ctx, nil)
	if err != nil {
		svc.stop()
		return nil, nil, err
	}
	return svc, cs, nil
}

// onService starts a service with one executor and measures it with f
// over one MCP session.
func onService(ctx context.Context, binDir string, f func(*service, *mcp.ClientSession) ([]row, error)) ([]row, error) {
	return onServiceWith(ctx, binDir, serviceOptions{executors: 1}, f)
}

// onServiceWith is onService on a service started with o.
func onServiceWith(ctx context.Context, binDir string, o serviceOptions, f func(*service, *mcp.ClientSession) ([]row, error)) ([]row, error) {
	svc, err := startService(binDir, o)
	if err != nil {
		return nil, err
	}
	defer svc.stop()
	cs, err := bench.Client{URL: svc.url, Token: svc.token}.Session(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer cs.Close()
	return f(svc, cs)
}
