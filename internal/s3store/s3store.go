// Package s3store keeps conversations' files in S3-compatible storage, so
// that the api needs no folder shared with the executors and a
// conversation can move from one executor to another.
//
// A conversation's files are the objects under
// "<prefix><client>/<id>/": one object per file, its key the file's path
// under /data. What is in the bucket was written by untrusted code (through
// an executor) or may have been put there by anyone with access to the
// bucket: every key read back is checked as a file name before use.
package s3store

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sync/semaphore"

	"github.com/runbox-dev/runbox"
)

// maxSpooling bounds the uploads spooled to the local disk at once, and so
// the disk they take (maxSpooling × the upload limit): more wait.
const maxSpooling = 8

// Store is a file store in one bucket.
type Store struct {
	mc       *minio.Client
	bucket   string
	prefix   string
	quota    int64
	spooling *semaphore.Weighted
}

var _ runbox.FileStore = (*Store)(nil)

// Options say where the bucket is and who opens it.
type Options struct {
	Bucket string
	Prefix string // "" or ending in '/'
	// Endpoint is the S3 server's http(s) URL; empty: AWS.
	Endpoint string
	Region   string
	// AccessKey, SecretKey and SessionToken are the credentials; without
	// them the shared credentials file and the instance role are tried.
	AccessKey, SecretKey, SessionToken string
}

// Open connects to the bucket cfg names, making it if it does not exist,
// and holds each conversation to quota bytes.
func Open(ctx context.Context, cfg *Options, quota int64) (*Store, error) {
	endpoint, secure := "s3.amazonaws.com", true
	if cfg.Endpoint != "" {
		u, err := url.Parse(cfg.Endpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, runbox.Errorf(runbox.EInvalid, "AWS_ENDPOINT_URL must be an http(s) URL")
		}
		endpoint, secure = u.Host, u.Scheme == "https"
	}
	creds := credentials.NewChainCredentials([]credentials.Provider{
		&credentials.FileAWSCredentials{}, &credentials.IAM{Client: http.DefaultClient},
	})
	if cfg.AccessKey != "" {
		creds = credentials.NewStaticV4(cfg.AccessKey, cfg.SecretKey, cfg.SessionToken)
	}
	mc, err := minio.New(endpoint, &minio.Options{Creds: creds, Secure: secure, Region: cfg.Region})
	if err != nil {
		return nil, fmt.Errorf("file store: %w", err)
	}
	s := &Store{mc: mc, bucket: cfg.Bucket, prefix: cfg.Prefix, quota: quota, spooling: semaphore.NewWeighted(maxSpooling)}
	exists, err := mc.BucketExists(ctx, cfg.Bucket)
	if err != nil {
		return nil, fmt.Errorf("file store: bucket %s at %s: %w", cfg.Bucket, endpoint, err)
	}
	if !exists {
		err := mc.MakeBucket(ctx, cfg.Bucket, minio.MakeBucketOptions{Region: cfg.Region})
		if code := minio.ToErrorResponse(err).Code; code == "BucketAlreadyOwnedByYou" || code == "BucketAlreadyExists" {
			err = nil // another process made it meanwhile
		}
		if err != nil {
			return nil, fmt.Errorf("file store: make bucket %s at %s: %w", cfg.Bucket, endpoint, err)
		}
	}
	return s, nil
}

// Ping checks that the bucket answers, for readiness.
func (s *Store) Ping(ctx context.Context) error {
	if _, err := s.mc.BucketExists(ctx, s.bucket); err != nil {
		return fmt.Errorf("file store: %w", err)
	}
	return nil
}

// convPrefix is where a conversation's objects are: under its client, so
// that a client's usage is one listing.
func (s *Store) convPrefix(conv string) (string, error) {
	client, id, ok := runbox.ParseConversationKey(conv)
	if !ok {
		return "", runbox.Errorf(runbox.EInvalid, "invalid conversationId")
	}
	return s.prefix + client + "/" + id + "/", nil
}

func (s *Store) key(conv, name string) (string, string, error) {
	prefix, err := s.convPrefix(conv)
	if err != nil {
		return "", "", err
	}
	name, err = runbox.CleanFileName(name)
	if err != nil {
		return "", "", err
	}
	return prefix + name, name, nil
}

// list calls fn for every object under prefix, until fn returns false.
func (s *Store) list(ctx context.Context, prefix string, fn func(minio.ObjectInfo) bool) error {
	ctx, cancel := context.WithCancel(ctx) // ends the listing if fn stops early
	defer cancel()
	for obj := range s.mc.ListObjects(ctx, s.bucket, minio.ListObjectsOptions{Prefix: prefix, Recursive: true}) {
		if obj.Err != nil {
			return fmt.Errorf("list files: %w", obj.Err)
		}
		if !fn(obj) {
			break
		}
	}
	return nil
}

func (s *Store) List(ctx context.Context, conv string) ([]runbox.StoredFile, error) {
	prefix, err := s.convPrefix(conv)
	if err != nil {
		return nil, err
	}
	var out []runbox.StoredFile
	err = s.list(ctx, prefix, func(obj minio.ObjectInfo) bool {
		name, err := runbox.CleanFileName(strings.TrimPrefix(obj.Key, prefix))
		if err != nil || name != strings.TrimPrefix(obj.Key, prefix) || strings.Count(name, "/") > runbox.MaxListDepth {
			return true // not a name a run could have written: never served
		}
		out = append(out, stored(name, obj))
		return len(out) < runbox.MaxListEntries
	})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b runbox.StoredFile) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

func stored(name string, obj minio.ObjectInfo) runbox.StoredFile {
	return runbox.StoredFile{Name: name, Size: obj.Size, ModTime: obj.LastModified, ETag: obj.ETag}
}

func (s *Store) Open(ctx context.Context, conv, name string) (io.ReadSeekCloser, runbox.StoredFile, error) {
	key, name, err := s.key(conv, name)
	if err != nil {
		return nil, runbox.StoredFile{}, err
	}
	obj, err := s.mc.GetObject(ctx, s.bucket, key, minio.GetObjectOptions{})
	if err != nil {
		return nil, runbox.StoredFile{}, fmt.Errorf("open file: %w", err)
	}
	info, err := obj.Stat()
	if err != nil {
		obj.Close()
		if isNotFound(err) {
			return nil, runbox.StoredFile{}, runbox.ErrFileNotFound
		}
		return nil, runbox.StoredFile{}, fmt.Errorf("open file: %w", err)
	}
	return obj, stored(name, info), nil
}

func isNotFound(err error) bool {
	code := minio.ToErrorResponse(err).Code
	return code == minio.NoSuchKey || code == "NotFound"
}

// Write spools the upload to a temporary file first: its size is then
// known before anything reaches the bucket, and a file over the limit or
// the quota leaves no object behind.
func (s *Store) Write(ctx context.Context, conv, name string, r io.Reader, limit int64, overwrite bool) (runbox.StoredFile, error) {
	if !runbox.ValidFileName(name) {
		return runbox.StoredFile{}, runbox.ErrFileName
	}
	key, name, err := s.key(conv, name)
	if err != nil {
		return runbox.StoredFile{}, err
	}
	var existing int64
	info, err := s.mc.StatObject(ctx, s.bucket, key, minio.StatObjectOptions{})
	switch {
	case err == nil && !overwrite:
		return runbox.StoredFile{}, runbox.FileExistsError(name)
	case err == nil:
		existing = info.Size
	case !isNotFound(err):
		return runbox.StoredFile{}, fmt.Errorf("inspect file: %w", err)
	}
	used, err := s.usage(ctx, conv)
	if err != nil {
		return runbox.StoredFile{}, err
	}
	free := max(0, s.quota-used+existing)

	if err := s.spooling.Acquire(ctx, 1); err != nil {
		return runbox.StoredFile{}, err
	}
	defer s.spooling.Release(1)
	tmp, err := os.CreateTemp("", "runbox-upload-")
	if err != nil {
		return runbox.StoredFile{}, fmt.Errorf("spool upload: %w", err)
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	n, err := io.Copy(tmp, io.LimitReader(r, min(limit, free)+1))
	switch {
	case err != nil:
		return runbox.StoredFile{}, fmt.Errorf("read upload: %w", err)
	case n > limit:
		return runbox.StoredFile{}, runbox.FileTooLargeError(limit)
	case n > free:
		return runbox.StoredFile{}, runbox.FileQuotaError(s.quota)
	}
	if _, err := tmp.Seek(0, io.SeekStart); err != nil {
		return runbox.StoredFile{}, fmt.Errorf("spool upload: %w", err)
	}
	opts := minio.PutObjectOptions{ContentType: "application/octet-stream"}
	if !overwrite {
		// A file of that name that appeared meanwhile is not replaced.
		opts.SetMatchETagExcept("*")
	}
	up, err := s.mc.PutObject(ctx, s.bucket, key, tmp, n, opts)
	if err != nil {
		if code := minio.ToErrorResponse(err).Code; code == "PreconditionFailed" {
			return runbox.StoredFile{}, runbox.FileExistsError(name)
		}
		return runbox.StoredFile{}, fmt.Errorf("store file: %w", err)
	}
	return runbox.StoredFile{Name: name, Size: n, ModTime: up.LastModified, ETag: up.ETag}, nil
}

// Put stores a file a run wrote, of size bytes, as its executor pushes it.
func (s *Store) Put(ctx context.Context, conv, name string, r io.Reader, size int64) (runbox.StoredFile, error) {
	key, name, err := s.key(conv, name)
	if err != nil {
		return runbox.StoredFile{}, err
	}
	up, err := s.mc.PutObject(ctx, s.bucket, key, r, size, minio.PutObjectOptions{ContentType: "application/octet-stream"})
	if err != nil {
		return runbox.StoredFile{}, fmt.Errorf("store file: %w", err)
	}
	return runbox.StoredFile{Name: name, Size: size, ModTime: up.LastModified, ETag: up.ETag}, nil
}

// Delete removes files of a conversation.
func (s *Store) Delete(ctx context.Context, conv string, names []string) error {
	for _, n := range names {
		key, _, err := s.key(conv, n)
		if err != nil {
			return err
		}
		if err := s.mc.RemoveObject(ctx, s.bucket, key, minio.RemoveObjectOptions{}); err != nil && !isNotFound(err) {
			return fmt.Errorf("delete file: %w", err)
		}
	}
	return nil
}

func (s *Store) Exists(ctx context.Context, conv string) (bool, error) {
	prefix, err := s.convPrefix(conv)
	if err != nil {
		return false, err
	}
	found := false
	err = s.list(ctx, prefix, func(minio.ObjectInfo) bool { found = true; return false })
	return found, err
}

func (s *Store) Remove(ctx context.Context, conv string) error {
	prefix, err := s.convPrefix(conv)
	if err != nil {
		return err
	}
	objs := make(chan minio.ObjectInfo)
	listErr := make(chan error, 1)
	go func() {
		defer close(objs)
		listErr <- s.list(ctx, prefix, func(obj minio.ObjectInfo) bool {
			select {
			case objs <- obj:
				return true
			case <-ctx.Done():
				return false
			}
		})
	}()
	var errs []error
	for rerr := range s.mc.RemoveObjects(ctx, s.bucket, objs, minio.RemoveObjectsOptions{}) {
		errs = append(errs, rerr.Err)
	}
	errs = append(errs, <-listErr, s.RemoveState(ctx, conv))
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("remove conversation files: %w", err)
	}
	return nil
}

// usage sums the sizes of a conversation's objects, all of them.
// usage returns the bytes a conversation takes: its files, and its saved
// interpreter state (beside them, stateKey), as on the host store.
func (s *Store) usage(ctx context.Context, conv string) (int64, error) {
	used, err := s.filesUsage(ctx, conv)
	if err != nil {
		return 0, err
	}
	state, err := s.StateSize(ctx, conv)
	return used + state, err
}

// filesUsage returns the bytes of a conversation's files.
func (s *Store) filesUsage(ctx context.Context, conv string) (int64, error) {
	prefix, err := s.convPrefix(conv)
	if err != nil {
		return 0, err
	}
	return s.sum(ctx, prefix)
}

func (s *Store) sum(ctx context.Context, prefix string) (int64, error) {
	var total int64
	err := s.list(ctx, prefix, func(obj minio.ObjectInfo) bool { total += obj.Size; return true })
	return total, err
}

func (s *Store) ClientUsage(ctx context.Context, client string) (int64, error) {
	if !runbox.ValidClientName(client) {
		return 0, runbox.Errorf(runbox.EInvalid, "invalid client")
	}
	return s.sum(ctx, s.prefix+client+"/")
}

func (s *Store) Usage(ctx context.Context, conv string) (int64, error) { return s.usage(ctx, conv) }

// maxCopying bounds the server-side copies a fork has in flight.
const maxCopying = 8

// Fork copies every object of src to dst with server-side copies: no byte
// passes through the service. Objects whose keys are not names a run could
// have written are left out, as List leaves them. A source that takes more
// than the quota is refused (EQuotaExceeded) before anything is copied.
// Installed packages stay
// in executors' working copies and are not in the bucket: the fork has
// none (Forked.Packages is false). S3 has no rename: a fork that fails
// removes what it copied.
func (s *Store) Fork(ctx context.Context, src, dst string) (runbox.Forked, error) {
	from, err := s.convPrefix(src)
	if err != nil {
		return runbox.Forked{}, err
	}
	to, err := s.convPrefix(dst)
	if err != nil || src == dst {
		return runbox.Forked{}, runbox.Errorf(runbox.EInvalid, "invalid conversationId")
	}
	if exists, err := s.Exists(ctx, dst); err != nil || exists {
		return runbox.Forked{}, cmp.Or(err, error(runbox.ErrForkExists))
	}
	var objs []minio.ObjectInfo
	err = s.list(ctx, from, func(obj minio.ObjectInfo) bool {
		if name, err := runbox.CleanFileName(strings.TrimPrefix(obj.Key, from)); err == nil && from+name == obj.Key {
			objs = append(objs, obj)
		}
		return true
	})
	if err != nil {
		return runbox.Forked{}, err
	}
	if err := s.fits(ctx, src, objs); err != nil {
		return runbox.Forked{}, err
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(maxCopying)
	for _, obj := range objs {
		g.Go(func() error {
			_, err := s.mc.CopyObject(gctx,
				minio.CopyDestOptions{Bucket: s.bucket, Object: to + strings.TrimPrefix(obj.Key, from)},
				minio.CopySrcOptions{Bucket: s.bucket, Object: obj.Key})
			if err != nil {
				return fmt.Errorf("copy %s: %w", strings.TrimPrefix(obj.Key, from), err)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		// Not on ctx: a cancelled fork must still go.
		if rerr := s.Remove(context.WithoutCancel(ctx), dst); rerr != nil {
			err = errors.Join(err, rerr)
		}
		return runbox.Forked{}, err
	}
	done := runbox.Forked{Files: len(objs), Cloned: len(objs)}
	for _, obj := range objs {
		done.Bytes += obj.Size
	}
	return done, nil
}

// fits checks, before anything is copied, that a fork of conversation
// src's objects and saved state fits a conversation's quota: the fork
// would hold them all, counted as every object is, whole.
func (s *Store) fits(ctx context.Context, src string, objs []minio.ObjectInfo) error {
	size, err := s.StateSize(ctx, src)
	if err != nil {
		return err
	}
	for _, obj := range objs {
		size += obj.Size
	}
	if size > s.quota {
		return runbox.Errorf(runbox.EQuotaExceeded,
			"the conversation's files take %d bytes, more than a conversation's quota of %d bytes", size, s.quota)
	}
	return nil
}

// Archive keeps the audit log's segments (audit.Archive) in the bucket,
// under "<prefix>.audit/": no client's name starts with '.', so no
// conversation's files are there.
type Archive struct{ s *Store }

// AuditArchive returns the bucket's archive of the audit log.
func (s *Store) AuditArchive() *Archive { return &Archive{s: s} }

func (a *Archive) key(name string) (string, error) {
	if name == "" || strings.ContainsAny(name, "/\\") || strings.HasPrefix(name, ".") {
		return "", fmt.Errorf("audit archive: %q is not a segment's name", name)
	}
	return a.s.prefix + ".audit/" + name, nil
}

func (a *Archive) Put(ctx context.Context, name string, data []byte) error {
	key, err := a.key(name)
	if err != nil {
		return err
	}
	if _, err := a.s.mc.PutObject(ctx, a.s.bucket, key, bytes.NewReader(data), int64(len(data)),
		minio.PutObjectOptions{ContentType: "application/jsonl"}); err != nil {
		return fmt.Errorf("audit archive: store %s: %w", name, err)
	}
	return nil
}

func (a *Archive) Get(ctx context.Context, name string) ([]byte, error) {
	key, err := a.key(name)
	if err != nil {
		return nil, err
	}
	obj, err := a.s.mc.GetObject(ctx, a.s.bucket, key, minio.GetObjectOptions{})
	if err != nil {
		return nil, fmt.Errorf("audit archive: read %s: %w", name, err)
	}
	defer obj.Close()
	b, err := io.ReadAll(obj)
	if isNotFound(err) {
		return nil, fmt.Errorf("audit archive: %s: %w", name, fs.ErrNotExist)
	}
	if err != nil {
		return nil, fmt.Errorf("audit archive: read %s: %w", name, err)
	}
	return b, nil
}

func (a *Archive) Remove(ctx context.Context, name string) error {
	key, err := a.key(name)
	if err != nil {
		return err
	}
	if err := a.s.mc.RemoveObject(ctx, a.s.bucket, key, minio.RemoveObjectOptions{}); err != nil && !isNotFound(err) {
		return fmt.Errorf("audit archive: remove %s: %w", name, err)
	}
	return nil
}

// stateKey is where a conversation's saved interpreter state is kept
// (internal/snapshot): beside its files' prefix, never under it, so no
// listing, download or working copy has it; under its client's, so the
// client's usage counts it. No conversation id has a '.'.
func (s *Store) stateKey(conv string) (string, error) {
	client, id, ok := runbox.ParseConversationKey(conv)
	if !ok {
		return "", runbox.Errorf(runbox.EInvalid, "invalid conversationId")
	}
	return s.prefix + client + "/" + id + ".kept-state", nil
}

// PutState stores what r yields as the conversation's saved state, or
// fails past limit bytes, storing nothing.
func (s *Store) PutState(ctx context.Context, conv string, r io.Reader, limit int64) (int64, error) {
	key, err := s.stateKey(conv)
	if err != nil {
		return 0, err
	}
	lr := &limitedReader{r: r, left: limit}
	up, err := s.mc.PutObject(ctx, s.bucket, key, lr, -1, minio.PutObjectOptions{ContentType: "application/octet-stream"})
	if lr.over {
		return 0, runbox.FileQuotaError(s.quota)
	}
	if err != nil {
		return 0, fmt.Errorf("store state: %w", err)
	}
	return up.Size, nil
}

// limitedReader fails once more than left bytes were read: an upload
// then fails whole.
type limitedReader struct {
	r    io.Reader
	left int64
	over bool
}

func (l *limitedReader) Read(p []byte) (int, error) {
	n, err := l.r.Read(p)
	l.left -= int64(n)
	if l.left < 0 {
		l.over = true
		return 0, errors.New("over the quota")
	}
	return n, err
}

// OpenState opens the conversation's saved state; runbox.ErrFileNotFound when
// none.
func (s *Store) OpenState(ctx context.Context, conv string) (io.ReadCloser, error) {
	key, err := s.stateKey(conv)
	if err != nil {
		return nil, err
	}
	obj, err := s.mc.GetObject(ctx, s.bucket, key, minio.GetObjectOptions{})
	if err == nil {
		_, err = obj.Stat()
	}
	if err != nil {
		if obj != nil {
			obj.Close()
		}
		if isNotFound(err) {
			return nil, runbox.ErrFileNotFound
		}
		return nil, fmt.Errorf("open state: %w", err)
	}
	return obj, nil
}

// RemoveState removes the conversation's saved state, if any.
func (s *Store) RemoveState(ctx context.Context, conv string) error {
	key, err := s.stateKey(conv)
	if err != nil {
		return err
	}
	if err := s.mc.RemoveObject(ctx, s.bucket, key, minio.RemoveObjectOptions{}); err != nil && !isNotFound(err) {
		return fmt.Errorf("remove state: %w", err)
	}
	return nil
}

// StateRoom returns how many bytes the conversation's saved state may
// take: its quota less its files (the state it replaces is room).
func (s *Store) StateRoom(ctx context.Context, conv string) (int64, error) {
	used, err := s.filesUsage(ctx, conv)
	if err != nil {
		return 0, err
	}
	return max(0, s.quota-used), nil
}

// StateSize returns the bytes of the conversation's saved state, 0 for
// none.
func (s *Store) StateSize(ctx context.Context, conv string) (int64, error) {
	key, err := s.stateKey(conv)
	if err != nil {
		return 0, err
	}
	info, err := s.mc.StatObject(ctx, s.bucket, key, minio.StatObjectOptions{})
	switch {
	case isNotFound(err):
		return 0, nil
	case err != nil:
		return 0, fmt.Errorf("inspect state: %w", err)
	}
	return info.Size, nil
}
