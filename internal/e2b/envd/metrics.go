package envd

import (
	"encoding/json"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Metrics is what GET /metrics answers: the sandbox's use of CPU, memory
// and disk, as its cgroup and its home's file system account them (E2B's
// envd's fields).
type Metrics struct {
	TS         int64   `json:"ts"`
	CPUCount   int     `json:"cpu_count"`
	CPUUsedPct float64 `json:"cpu_used_pct"`
	MemTotal   int64   `json:"mem_total"`
	MemUsed    int64   `json:"mem_used"`
	MemCache   int64   `json:"mem_cache"`
	DiskUsed   int64   `json:"disk_used"`
	DiskTotal  int64   `json:"disk_total"`
}

// cpuSample is the sandbox's CPU time at a moment, for the next reading's
// rate.
type cpuSample struct {
	mu    sync.Mutex
	at    time.Time
	usage int64 // nanoseconds
}

func (s *Server) metrics(w http.ResponseWriter, _ *http.Request) {
	m := readMetrics(s.paths.data, time.Now(), &s.cpu)
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(m)
}

// readMetrics reads the sandbox's use now: cgroup v2's files, else v1's.
func readMetrics(data string, now time.Time, last *cpuSample) Metrics {
	m := Metrics{TS: now.Unix(), CPUCount: runtime.NumCPU()}
	m.MemUsed = firstInt("/sys/fs/cgroup/memory.current", "/sys/fs/cgroup/memory/memory.usage_in_bytes")
	m.MemTotal = firstInt("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")
	if m.MemTotal <= 0 || m.MemTotal > 1<<50 {
		var si unix.Sysinfo_t
		if unix.Sysinfo(&si) == nil {
			m.MemTotal = int64(si.Totalram) * int64(si.Unit)
		}
	}
	m.MemCache = statField("/sys/fs/cgroup/memory.stat", "file")
	if m.MemCache == 0 {
		m.MemCache = statField("/sys/fs/cgroup/memory/memory.stat", "cache")
	}
	if quota := cpuQuota(); quota > 0 {
		m.CPUCount = max(1, int(quota+0.999))
	}
	m.CPUUsedPct = last.percent(now, m.CPUCount)
	var fs unix.Statfs_t
	if unix.Statfs(data, &fs) == nil {
		m.DiskTotal = int64(fs.Blocks) * fs.Bsize
		m.DiskUsed = int64(fs.Blocks-fs.Bfree) * fs.Bsize
	}
	return m
}

// percent is the sandbox's CPU use since the last reading, in percent of
// its cores.
func (last *cpuSample) percent(now time.Time, cores int) float64 {
	usage := firstInt("/sys/fs/cgroup/cpuacct/cpuacct.usage")
	if usage == 0 {
		usage = statField("/sys/fs/cgroup/cpu.stat", "usage_usec") * 1000
	}
	last.mu.Lock()
	defer last.mu.Unlock()
	prevAt, prev := last.at, last.usage
	last.at, last.usage = now, usage
	elapsed := now.Sub(prevAt)
	if prevAt.IsZero() || elapsed <= 0 || usage < prev {
		return 0
	}
	return float64(usage-prev) / float64(elapsed.Nanoseconds()) / float64(cores) * 100
}

// cpuQuota is the sandbox's CPU limit in cores; 0 for none.
func cpuQuota() float64 {
	if b, err := os.ReadFile("/sys/fs/cgroup/cpu.max"); err == nil {
		f := strings.Fields(string(b))
		if len(f) == 2 && f[0] != "max" {
			q, _ := strconv.ParseFloat(f[0], 64)
			p, _ := strconv.ParseFloat(f[1], 64)
			if p > 0 {
				return q / p
			}
		}
		return 0
	}
	q := firstInt("/sys/fs/cgroup/cpu/cpu.cfs_quota_us")
	p := firstInt("/sys/fs/cgroup/cpu/cpu.cfs_period_us")
	if q > 0 && p > 0 {
		return float64(q) / float64(p)
	}
	return 0
}

// firstInt reads the first of the files that holds an integer.
func firstInt(paths ...string) int64 {
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		if n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil {
			return n
		}
	}
	return 0
}

// statField reads one "name value" line of a cgroup stat file.
func statField(path, name string) int64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if k, v, ok := strings.Cut(line, " "); ok && k == name {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
}
