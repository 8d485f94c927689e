package envd

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"connectrpc.com/connect"

	fspb "github.com/runbox-dev/runbox/internal/e2b/envdpb/filesystem"
)

// maxListed bounds the entries one ListDir returns.
const maxListed = 100000

// filesystemService is the filesystem service (filesystem.proto).
type filesystemService struct{ s *Server }

// path checks a request's user and resolves the path it names.
func (f *filesystemService) path(h interface{ Get(string) string }, name string) (string, error) {
	if err := f.s.checkName(basicUser(h.Get("Authorization"))); err != nil {
		return "", err
	}
	return f.s.paths.resolve(name)
}

func (f *filesystemService) Stat(_ context.Context, req *connect.Request[fspb.StatRequest]) (*connect.Response[fspb.StatResponse], error) {
	p, err := f.path(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	e, err := f.s.entry(p)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&fspb.StatResponse{Entry: e}), nil
}

// MakeDir makes a folder and the folders above it; one that is there
// already is already_exists (the SDK's make_dir answers false).
func (f *filesystemService) MakeDir(_ context.Context, req *connect.Request[fspb.MakeDirRequest]) (*connect.Response[fspb.MakeDirResponse], error) {
	p, err := f.path(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	if _, err := os.Lstat(p); err == nil {
		return nil, connect.NewError(connect.CodeAlreadyExists, errors.New("the path exists already"))
	}
	made, err := mkdirAll(p)
	if err != nil {
		return nil, fsError(err)
	}
	// Recursive watchers watch the new folders before the call answers:
	// a write into them that follows is seen.
	f.s.watch.madeDirs(made)
	e, err := f.s.entry(p)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&fspb.MakeDirResponse{Entry: e}), nil
}

// mkdirAll makes p and the folders above it that are missing (0755 less
// the umask), and returns those it made, the highest first.
func mkdirAll(p string) ([]string, error) {
	var missing []string
	for d := p; ; d = filepath.Dir(d) {
		if _, err := os.Lstat(d); err == nil || d == filepath.Dir(d) {
			break
		}
		missing = append(missing, d)
	}
	made := make([]string, 0, len(missing))
	for i := len(missing) - 1; i >= 0; i-- {
		if err := os.Mkdir(missing[i], 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return made, err
		}
		made = append(made, missing[i])
	}
	return made, nil
}

// Move renames a file or folder, making the destination's folders.
func (f *filesystemService) Move(_ context.Context, req *connect.Request[fspb.MoveRequest]) (*connect.Response[fspb.MoveResponse], error) {
	src, err := f.path(req.Header(), req.Msg.GetSource())
	if err != nil {
		return nil, err
	}
	dst, err := f.s.paths.resolve(req.Msg.GetDestination())
	if err != nil {
		return nil, err
	}
	if _, err := os.Lstat(src); err != nil {
		return nil, fsError(err)
	}
	made, err := mkdirAll(filepath.Dir(dst))
	if err != nil {
		return nil, fsError(err)
	}
	f.s.watch.madeDirs(made)
	if err := os.Rename(src, dst); err != nil {
		return nil, fsError(err)
	}
	e, err := f.s.entry(dst)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&fspb.MoveResponse{Entry: e}), nil
}

// ListDir lists a folder's entries to a depth (1: its own), in the order
// of their paths; links to folders are not followed.
func (f *filesystemService) ListDir(ctx context.Context, req *connect.Request[fspb.ListDirRequest]) (*connect.Response[fspb.ListDirResponse], error) {
	root, err := f.path(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	fi, err := os.Stat(root)
	if err != nil {
		return nil, fsError(err)
	}
	if !fi.IsDir() {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("the path is not a folder"))
	}
	// A link to a folder is listed as that folder, its entries under the
	// name the client gave.
	real, err := filepath.EvalSymlinks(root)
	if err != nil {
		return nil, fsError(err)
	}
	depth := max(int(req.Msg.GetDepth()), 1)
	var entries []*fspb.EntryInfo
	err = filepath.WalkDir(real, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == real {
				return err
			}
			return nil // gone, or unreadable: left out
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if p == real {
			return nil
		}
		rel, _ := filepath.Rel(real, p)
		level := strings.Count(rel, string(filepath.Separator)) + 1
		if level > depth {
			return fs.SkipDir
		}
		if len(entries) >= maxListed {
			return errTooMany
		}
		fi, err := d.Info()
		if err != nil {
			return nil
		}
		shown := filepath.Join(root, rel)
		e := f.s.entryOf(p, fi)
		e.Path = f.s.paths.show(shown)
		entries = append(entries, e)
		return nil
	})
	if errors.Is(err, errTooMany) {
		return nil, connect.NewError(connect.CodeResourceExhausted, err)
	}
	if err != nil {
		return nil, fsError(err)
	}
	return connect.NewResponse(&fspb.ListDirResponse{Entries: entries}), nil
}

var errTooMany = errors.New("the folder holds more entries than one listing returns (100000); list a deeper folder")

// Remove removes a file or a folder and all it holds; one that is not
// there is no error.
func (f *filesystemService) Remove(_ context.Context, req *connect.Request[fspb.RemoveRequest]) (*connect.Response[fspb.RemoveResponse], error) {
	p, err := f.path(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	if p == "/" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("the root is not removed"))
	}
	if err := os.RemoveAll(p); err != nil {
		return nil, fsError(err)
	}
	return connect.NewResponse(&fspb.RemoveResponse{}), nil
}

func (f *filesystemService) WatchDir(ctx context.Context, req *connect.Request[fspb.WatchDirRequest], stream *connect.ServerStream[fspb.WatchDirResponse]) error {
	p, err := f.path(req.Header(), req.Msg.GetPath())
	if err != nil {
		return err
	}
	return f.s.watch.stream(ctx, watchSpec{path: p, recursive: req.Msg.GetRecursive(), entries: req.Msg.GetIncludeEntry()},
		keepalive(req.Header()), stream)
}

func (f *filesystemService) CreateWatcher(_ context.Context, req *connect.Request[fspb.CreateWatcherRequest]) (*connect.Response[fspb.CreateWatcherResponse], error) {
	p, err := f.path(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	id, err := f.s.watch.create(watchSpec{path: p, recursive: req.Msg.GetRecursive(), entries: req.Msg.GetIncludeEntry()})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&fspb.CreateWatcherResponse{WatcherId: id}), nil
}

func (f *filesystemService) GetWatcherEvents(_ context.Context, req *connect.Request[fspb.GetWatcherEventsRequest]) (*connect.Response[fspb.GetWatcherEventsResponse], error) {
	evs, err := f.s.watch.events(req.Msg.GetWatcherId())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&fspb.GetWatcherEventsResponse{Events: evs}), nil
}

func (f *filesystemService) RemoveWatcher(_ context.Context, req *connect.Request[fspb.RemoveWatcherRequest]) (*connect.Response[fspb.RemoveWatcherResponse], error) {
	if err := f.s.watch.remove(req.Msg.GetWatcherId()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&fspb.RemoveWatcherResponse{}), nil
}
