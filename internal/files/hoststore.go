package files

import (
	"context"
	"io"

	"github.com/runbox-dev/runbox"
)

// HostStore is the file store of a deployment whose processes share the
// host folder: the folders the sandboxes mount are the store.
type HostStore struct{ f *Folders }

var _ runbox.FileStore = HostStore{}

// NewHostStore serves the folders as the file store.
func NewHostStore(f *Folders) HostStore { return HostStore{f: f} }

func (h HostStore) List(_ context.Context, conv string) ([]runbox.StoredFile, error) {
	return h.f.List(conv)
}

func (h HostStore) Open(_ context.Context, conv, name string) (io.ReadSeekCloser, runbox.StoredFile, error) {
	name, err := runbox.CleanFileName(name)
	if err != nil {
		return nil, runbox.StoredFile{}, err
	}
	file, info, err := h.f.Open(conv, name)
	if err != nil {
		return nil, runbox.StoredFile{}, err
	}
	return file, runbox.StoredFile{Name: name, Size: info.Size(), ModTime: info.ModTime()}, nil
}

func (h HostStore) Write(_ context.Context, conv, name string, r io.Reader, limit int64, overwrite bool) (runbox.StoredFile, error) {
	return h.f.Write(conv, name, r, limit, overwrite)
}

func (h HostStore) Exists(_ context.Context, conv string) (bool, error) { return h.f.Exists(conv), nil }

func (h HostStore) Remove(_ context.Context, conv string) error { return h.f.Remove(conv) }

func (h HostStore) ClientUsage(_ context.Context, client string) (int64, error) {
	return h.f.ClientUsage(client)
}

func (h HostStore) Usage(_ context.Context, conv string) (int64, error) {
	used, _, err := h.f.Usage(conv)
	return used, err
}

func (h HostStore) Fork(ctx context.Context, src, dst string) (runbox.Forked, error) {
	return h.f.Fork(ctx, src, dst)
}
