package envd

import (
	"context"
	"crypto/rand"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
	"unsafe"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	fspb "github.com/runbox-dev/runbox/internal/e2b/envdpb/filesystem"
)

// Folders are watched with one inotify instance for the whole daemon:
// the kernel bounds instances per user across the host (every sandbox's
// user shares them), so a sandbox takes one, however many watchers its
// clients open. Its events are read without blocking whenever a client
// asks for them (GetWatcherEvents) and by a loop otherwise, so that what
// happened before a call is in its answer.

// maxWatches bounds the folders the daemon watches at once (recursive
// watchers watch each folder under theirs).
const maxWatches = 8192

// watchMask is what a watched folder reports.
const watchMask = unix.IN_CREATE | unix.IN_MODIFY | unix.IN_ATTRIB | unix.IN_DELETE | unix.IN_MOVED_FROM |
	unix.IN_MOVED_TO | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF | unix.IN_ONLYDIR

var (
	errNoWatcher    = errors.New("no such watcher")
	errTooManyWatch = errors.New("too many folders watched; stop a watcher first")
)

// watchSpec is what a client asked to watch.
type watchSpec struct {
	path      string // resolved, as the client named it
	recursive bool
	entries   bool // include each event's entry
}

// watchers are the daemon's folder watchers and its inotify instance.
type watchers struct {
	s *Server

	mu     sync.Mutex
	fd     int                           // -1 until the first watcher
	byWD   map[int32]map[*watcher]string // what each watch descriptor is, to each watcher: a folder relative to its root
	byID   map[string]*watcher           // the trio's watchers
	open   int                           // watchers open, streams included
	closed bool
	buf    []byte
}

func newWatchers(s *Server) *watchers {
	return &watchers{s: s, fd: -1, byWD: map[int32]map[*watcher]string{}, byID: map[string]*watcher{},
		buf: make([]byte, 64<<10)}
}

// watcher is one client's watch of a folder: the events it has not been
// given yet.
type watcher struct {
	spec   watchSpec
	root   string // the folder's real path
	events []*fspb.FilesystemEvent
	lost   bool          // events went past the bound since the last read
	ready  chan struct{} // signalled when events come (streams)
}

// add opens a watcher of spec: the folder must be one.
func (ws *watchers) add(spec watchSpec) (*watcher, error) {
	fi, err := os.Stat(spec.path)
	if err != nil {
		return nil, fsError(err)
	}
	if !fi.IsDir() {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("the path is not a folder"))
	}
	root, err := filepath.EvalSymlinks(spec.path)
	if err != nil {
		return nil, fsError(err)
	}
	w := &watcher{spec: spec, root: root, ready: make(chan struct{}, 1)}
	ws.mu.Lock()
	defer ws.mu.Unlock()
	switch {
	case ws.closed:
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("the daemon is stopping"))
	case ws.open >= ws.s.cfg.Limits.Watchers:
		return nil, connect.NewError(connect.CodeResourceExhausted, errors.New("too many watchers open; stop one first"))
	}
	if err := ws.ensureLocked(); err != nil {
		return nil, err
	}
	if err := ws.watchLocked(w, root, ""); err != nil {
		ws.unwatchLocked(w)
		return nil, err
	}
	ws.open++
	return w, nil
}

// ensureLocked opens the inotify instance and starts its loop.
func (ws *watchers) ensureLocked() error {
	if ws.fd >= 0 {
		return nil
	}
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return connect.NewError(connect.CodeResourceExhausted, err)
	}
	ws.fd = fd
	go ws.loop(fd)
	return nil
}

// loop reads events as they come until the instance closes.
func (ws *watchers) loop(fd int) {
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		_, err := unix.Poll(fds, 1000)
		ws.mu.Lock()
		if ws.fd != fd {
			ws.mu.Unlock()
			return
		}
		ws.drainLocked()
		ws.mu.Unlock()
		if err != nil && !errors.Is(err, unix.EINTR) {
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// watchLocked watches dir (rel below w's root) for w, and with a
// recursive w every folder below it.
func (ws *watchers) watchLocked(w *watcher, dir, rel string) error {
	if err := ws.addWatchLocked(w, dir, rel); err != nil {
		return err
	}
	if !w.spec.recursive {
		return nil
	}
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir || !d.IsDir() {
			return nil
		}
		r, _ := filepath.Rel(w.root, p)
		return ws.addWatchLocked(w, p, r)
	})
}

func (ws *watchers) addWatchLocked(w *watcher, dir, rel string) error {
	if len(ws.byWD) >= maxWatches {
		return connect.NewError(connect.CodeResourceExhausted, errTooManyWatch)
	}
	wd, err := unix.InotifyAddWatch(ws.fd, dir, watchMask)
	if err != nil {
		return fsError(&fs.PathError{Op: "watch", Path: ws.s.paths.show(dir), Err: err})
	}
	m := ws.byWD[int32(wd)]
	if m == nil {
		m = map[*watcher]string{}
		ws.byWD[int32(wd)] = m
	}
	m[w] = rel
	return nil
}

// unwatchLocked takes w off every watch descriptor, removing those no
// other watcher uses.
func (ws *watchers) unwatchLocked(w *watcher) {
	for wd, m := range ws.byWD {
		if _, ok := m[w]; !ok {
			continue
		}
		delete(m, w)
		if len(m) == 0 {
			delete(ws.byWD, wd)
			_, _ = unix.InotifyRmWatch(ws.fd, uint32(wd))
		}
	}
}

// drainLocked reads the events waiting, without blocking, and hands each
// to the watchers of its folder.
func (ws *watchers) drainLocked() {
	for {
		n, err := unix.Read(ws.fd, ws.buf)
		if err != nil || n <= 0 {
			return
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&ws.buf[off]))
			end := off + unix.SizeofInotifyEvent + int(ev.Len)
			if end > n {
				break
			}
			name := strings.TrimRight(string(ws.buf[off+unix.SizeofInotifyEvent:end]), "\x00")
			ws.dispatchLocked(ev.Wd, ev.Mask, name)
			off = end
		}
	}
}

// dispatchLocked turns one inotify event into the watchers' events.
func (ws *watchers) dispatchLocked(wd int32, mask uint32, name string) {
	if mask&unix.IN_IGNORED != 0 {
		delete(ws.byWD, wd)
		return
	}
	if name == "" {
		// The folder itself went (deleted, moved): its parent's watch,
		// or the client's removal of its root, tells.
		return
	}
	typ := eventType(mask)
	for w, dir := range ws.byWD[wd] {
		rel := filepath.Join(dir, name)
		if w.spec.recursive && mask&unix.IN_ISDIR != 0 && mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0 {
			_ = ws.watchLocked(w, filepath.Join(w.root, rel), rel)
		}
		if typ == fspb.EventType_EVENT_TYPE_UNSPECIFIED {
			continue
		}
		ev := &fspb.FilesystemEvent{Name: rel, Type: typ}
		if w.spec.entries && typ != fspb.EventType_EVENT_TYPE_REMOVE && typ != fspb.EventType_EVENT_TYPE_RENAME {
			if e, err := ws.s.entry(filepath.Join(w.root, rel)); err == nil {
				e.Path = ws.s.paths.show(filepath.Join(w.spec.path, rel))
				ev.Entry = e
			}
		}
		w.push(ev, ws.s.cfg.Limits.WatcherEvents)
	}
}

// eventType is what an inotify event is to a client.
func eventType(mask uint32) fspb.EventType {
	switch {
	case mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0:
		return fspb.EventType_EVENT_TYPE_CREATE
	case mask&unix.IN_MODIFY != 0:
		return fspb.EventType_EVENT_TYPE_WRITE
	case mask&(unix.IN_DELETE|unix.IN_DELETE_SELF) != 0:
		return fspb.EventType_EVENT_TYPE_REMOVE
	case mask&(unix.IN_MOVED_FROM|unix.IN_MOVE_SELF) != 0:
		return fspb.EventType_EVENT_TYPE_RENAME
	case mask&unix.IN_ATTRIB != 0:
		return fspb.EventType_EVENT_TYPE_CHMOD
	}
	return fspb.EventType_EVENT_TYPE_UNSPECIFIED
}

// push keeps ev for its watcher, within the bound: past it, events are
// dropped (and the watcher's next read says so).
func (w *watcher) push(ev *fspb.FilesystemEvent, bound int) {
	if len(w.events) >= bound {
		w.lost = true
		return
	}
	w.events = append(w.events, ev)
	select {
	case w.ready <- struct{}{}:
	default:
	}
}

// take returns w's events so far, and forgets them.
func (ws *watchers) takeLocked(w *watcher) ([]*fspb.FilesystemEvent, bool) {
	evs, lost := w.events, w.lost
	w.events, w.lost = nil, false
	return evs, lost
}

// madeDirs has the recursive watchers over folders the daemon just made
// watch them, before the call that made them answers.
func (ws *watchers) madeDirs(dirs []string) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ws.fd < 0 || len(dirs) == 0 {
		return
	}
	ws.drainLocked()
	seen := map[*watcher]bool{}
	for _, m := range ws.byWD {
		for w := range m {
			seen[w] = true
		}
	}
	for w := range seen {
		if !w.spec.recursive {
			continue
		}
		for _, d := range dirs {
			real, err := filepath.EvalSymlinks(d)
			if err != nil {
				continue
			}
			if rel, err := filepath.Rel(w.root, real); err == nil && rel != "." && !strings.HasPrefix(rel, "..") {
				_ = ws.addWatchLocked(w, real, rel)
			}
		}
	}
}

// create opens a watcher of the trio and returns its id.
func (ws *watchers) create(spec watchSpec) (string, error) {
	w, err := ws.add(spec)
	if err != nil {
		return "", err
	}
	id := rand.Text()
	ws.mu.Lock()
	ws.byID[id] = w
	ws.mu.Unlock()
	return id, nil
}

// events returns a trio's watcher's events since the last call: those
// that happened before this call included.
func (ws *watchers) events(id string) ([]*fspb.FilesystemEvent, error) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	w, ok := ws.byID[id]
	if !ok {
		return nil, connect.NewError(connect.CodeNotFound, errNoWatcher)
	}
	ws.drainLocked()
	evs, lost := ws.takeLocked(w)
	if lost {
		return evs, connect.NewError(connect.CodeResourceExhausted,
			errors.New("the watcher's events went past its bound and some were dropped; read them more often"))
	}
	return evs, nil
}

// remove closes a trio's watcher.
func (ws *watchers) remove(id string) error {
	ws.mu.Lock()
	w, ok := ws.byID[id]
	delete(ws.byID, id)
	ws.mu.Unlock()
	if !ok {
		return connect.NewError(connect.CodeNotFound, errNoWatcher)
	}
	ws.close(w)
	return nil
}

func (ws *watchers) close(w *watcher) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	ws.unwatchLocked(w)
	ws.open--
}

// stream serves WatchDir: a start event, then events as they come, and
// keepalives, until the client goes.
func (ws *watchers) stream(ctx context.Context, spec watchSpec, every time.Duration, out *connect.ServerStream[fspb.WatchDirResponse]) error {
	w, err := ws.add(spec)
	if err != nil {
		return err
	}
	defer ws.close(w)
	if err := out.Send(&fspb.WatchDirResponse{Event: &fspb.WatchDirResponse_Start{Start: &fspb.WatchDirResponse_StartEvent{}}}); err != nil {
		return err
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			if err := out.Send(&fspb.WatchDirResponse{Event: &fspb.WatchDirResponse_Keepalive{Keepalive: &fspb.WatchDirResponse_KeepAlive{}}}); err != nil {
				return err
			}
		case <-w.ready:
			ws.mu.Lock()
			evs, lost := ws.takeLocked(w)
			ws.mu.Unlock()
			for _, ev := range evs {
				if err := out.Send(&fspb.WatchDirResponse{Event: &fspb.WatchDirResponse_Filesystem{Filesystem: ev}}); err != nil {
					return err
				}
			}
			if lost {
				return connect.NewError(connect.CodeResourceExhausted, errors.New("the client did not keep up with the folder's events"))
			}
		}
	}
}

// closeAll ends every watcher and the inotify instance.
func (ws *watchers) closeAll() {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	ws.closed = true
	if ws.fd >= 0 {
		_ = unix.Close(ws.fd)
		ws.fd = -1
	}
	ws.byWD = map[int32]map[*watcher]string{}
	ws.byID = map[string]*watcher{}
}
