package agent

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Quota bounds what programs leave in the agent's folder (Config.Dir)
// while they run. An engine whose sandboxes' folder is not the
// executor's (Kubernetes: /data is a pod's emptyDir, copied out after
// each run) has no executor measure it as a run goes, as walk mode does
// on Docker: the agent does, and stops a program whose folder passed a
// bound (Exit.Quota).
type Quota struct {
	Bytes   int64 // 0: no bound
	Entries int   // files, folders and links, the folder itself too; 0: no bound
}

// Values of Exit.Quota: the bound a run's folder passed.
const (
	QuotaBytes   = "bytes"
	QuotaEntries = "entries"
)

// minEntryBytes is what an entry counts for at least, as walk mode
// counts it (package files): an empty file takes no block but an inode,
// and a million of them must not be free.
const minEntryBytes = 4096

// usage is what a folder holds, as a Quota counts it.
type usage struct {
	bytes   int64
	entries int
	// whole is false when the walk could not see everything (a folder
	// it may not read, a path too long to name): what it did not see
	// could hold anything, so the folder counts as past its bounds.
	whole bool
}

// measure counts what dir holds: every entry, dir itself too, for its
// apparent size or its allocated blocks, whichever is larger (what a
// copy out of the sandbox writes, and what the sandbox takes of its
// disk), and minEntryBytes at least. It stops past limit entries (0: no
// limit): what passed a bound need not be counted whole, and a walk
// bounded so takes milliseconds.
func measure(dir string, limit int) usage {
	// What a program removed as the walk went is simply not counted.
	gone := func(err error) error {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	u := usage{}
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return gone(err)
		}
		u.entries++
		if limit > 0 && u.entries > limit {
			return filepath.SkipAll
		}
		info, err := d.Info()
		if err != nil {
			return gone(err)
		}
		size := info.Size()
		if st, ok := info.Sys().(*syscall.Stat_t); ok {
			size = max(size, st.Blocks*512)
		}
		u.bytes += max(size, minEntryBytes)
		return nil
	})
	u.whole = err == nil
	return u
}

// passed returns the bound now passes, "" if none. Only growth past a
// bound counts, as for walk mode's runs on Docker: a run in a folder
// already past it (the bound was lowered) may still delete files. A
// folder the walk could not see whole has passed them all, and so has
// one past twice its entries (startLimit): its growth is not measured.
func (q Quota) passed(start, now usage) string {
	switch {
	case !now.whole:
		return QuotaEntries
	case q.Entries > 0 && now.entries > q.Entries && (now.entries > start.entries || start.entries > q.startLimit()):
		return QuotaEntries
	case q.Bytes > 0 && now.bytes > q.Bytes && now.bytes > start.bytes:
		return QuotaBytes
	}
	return ""
}

// startLimit bounds the walk of a run's folder before the run: twice
// the entries' bound, so that the growth of a folder already past it (by
// up to as much again) can be told.
func (q Quota) startLimit() int { return 2 * q.Entries }

// limit bounds the walks of a run's folder as the run goes, given what
// it held at the start: one entry past the bound, or past the start,
// tells the run passed it.
func (q Quota) limit(start usage) int {
	if q.Entries == 0 {
		return 0
	}
	return max(q.Entries, start.entries)
}

func (q Quota) set() bool { return q.Bytes > 0 || q.Entries > 0 }

// dataWatch measures a run's folder as the run goes (Config.Quota).
type dataWatch struct {
	q     Quota
	dir   string
	start usage
	limit int // of the walks as the run goes (Quota.limit)
	// passed is closed once a measure finds a bound passed, which bound
	// then says.
	passed chan struct{}
	bound  string
	stopc  chan struct{}
	done   chan struct{}
}

// watchInterval is how often a run's folder is measured at most, as walk
// mode measures it on Docker. A measure that takes long is spaced out
// more (watchShare): the agent shares its sandbox's CPU with the program.
const (
	watchInterval = 250 * time.Millisecond
	watchShare    = 10
)

// watchData measures dir now, before the run's program starts (a
// measure of what it already added could not tell its growth), then as
// the run goes, until stop.
func watchData(dir string, q Quota) *dataWatch {
	start := measure(dir, q.startLimit())
	w := &dataWatch{q: q, dir: dir, start: start, limit: q.limit(start), passed: make(chan struct{}),
		stopc: make(chan struct{}), done: make(chan struct{})}
	go w.loop()
	return w
}

func (w *dataWatch) loop() {
	defer close(w.done)
	wait := watchInterval
	for {
		select {
		case <-w.stopc:
			return
		case <-time.After(wait):
		}
		began := time.Now()
		if w.bound = w.check(); w.bound != "" {
			close(w.passed)
			return
		}
		wait = max(watchInterval, watchShare*time.Since(began))
	}
}

// stop ends the watch and returns the bound the run's folder passed: as
// a measure found it, or as one more finds it now, once the program is
// gone (it may have passed a bound and ended between two measures).
func (w *dataWatch) stop() string {
	close(w.stopc)
	<-w.done
	if w.bound == "" {
		w.bound = w.check()
	}
	return w.bound
}

// check measures the folder and returns the bound it passed, if any.
func (w *dataWatch) check() string { return w.q.passed(w.start, measure(w.dir, w.limit)) }

// LimitFileSize bounds every file this process and those it starts
// write to bytes (RLIMIT_FSIZE, soft and hard: no program may raise it
// again), as Docker's ulimit bounds a container's: a write past it fails
// with EFBIG and the writer gets SIGXFSZ. A lower limit the process has
// already is kept.
func LimitFileSize(bytes int64) error {
	if bytes <= 0 {
		return fmt.Errorf("a file size bound of %d bytes", bytes)
	}
	var cur unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_FSIZE, &cur); err != nil {
		return fmt.Errorf("getrlimit(RLIMIT_FSIZE): %w", err)
	}
	n := min(uint64(bytes), cur.Max)
	if err := unix.Setrlimit(unix.RLIMIT_FSIZE, &unix.Rlimit{Cur: min(n, cur.Cur), Max: n}); err != nil {
		return fmt.Errorf("setrlimit(RLIMIT_FSIZE): %w", err)
	}
	return nil
}
