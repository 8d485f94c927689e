// Package conversations is the file side of a conversation, as the tools
// and REST routes see it: upload, list, read, and close (which also ends
// the conversation's runs).
package conversations

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/files"
	"github.com/runbox-dev/runbox/internal/runs"
)

// Limits bound what clients send and get.
type Limits struct {
	// Quota is the bytes one conversation's files may take, as its file
	// store counts them (SANDBOX_QUOTA_BYTES); 0 is no bound here.
	Quota               int64
	MaxUpload           int64
	MaxRead             int64
	MaxInlineImages     int
	MaxInlineImageBytes int64
}

// Store is what the Service reads and writes of runs and conversations
// (the store's Runs and Conversations: a *store.Store).
type Store interface {
	Busy
	Run(ctx context.Context, id string) (runbox.Run, error)
	// RecentRuns lists up to n runs of the conversation key cid, newest
	// first.
	RecentRuns(ctx context.Context, client, cid string, n int) ([]runbox.Run, error)
	// PublishClosed tells the executors that conversation cid is closed.
	PublishClosed(ctx context.Context, cid string) error
	// Mark reads what conversation cid looks like now, ClaimConversations
	// claims ids for new conversations for ttl (returning one in use, if
	// any), ReleaseConversations lets them go (forks).
	Mark(ctx context.Context, cid string) (runbox.Mark, error)
	ClaimConversations(ctx context.Context, cids []string, ttl time.Duration) (string, error)
	ReleaseConversations(ctx context.Context, cids []string) error
	// Retention is how long runs are kept.
	Retention() time.Duration
}

// Service serves conversations' files.
type Service struct {
	files  runbox.FileStore
	signer *files.Signer
	runs   *runs.Service
	store  Store
	// state copies kept state to forks; nil where there is none to copy.
	state  StateForker
	limits Limits
	// closeWait bounds how long Close waits for the runs it cancelled
	// to end.
	closeWait time.Duration
}

// NewService returns a Service; state (nil for none) gives forks their
// source's kept state.
func NewService(fs runbox.FileStore, signer *files.Signer, rs *runs.Service, st Store, state StateForker,
	limits Limits) *Service {
	return &Service{files: fs, signer: signer, runs: rs, store: st, state: state, limits: limits, closeWait: time.Minute}
}

// Limits returns the service's limits.
func (s *Service) Limits() Limits { return s.limits }

// The caller names its conversations by their ids; each method turns the
// id into the caller's conversation key (runs.ConversationKey), so that no
// client reaches another's files.

// info describes a file of the conversation key, with a fresh download URL.
func (s *Service) info(key string, e runbox.StoredFile) runbox.FileInfo {
	return s.signer.Info(key, e)
}

// Uploaded is what upload_file returns.
type Uploaded struct {
	ConversationID string `json:"conversationId"`
	runbox.FileInfo
}

// Upload stores r as the file name of conversation cid (made when empty).
func (s *Service) Upload(ctx context.Context, cid, name string, r io.Reader, overwrite bool) (Uploaded, error) {
	if cid == "" {
		cid = runs.NewConversationID()
	}
	key, err := runs.ConversationKey(ctx, cid)
	if err != nil {
		return Uploaded{}, err
	}
	if err := s.runs.AdmitConversation(ctx, key); err != nil {
		return Uploaded{}, err
	}
	e, err := s.files.Write(ctx, key, name, r, s.limits.MaxUpload, overwrite)
	if err != nil {
		return Uploaded{}, err
	}
	return Uploaded{ConversationID: cid, FileInfo: s.info(key, e)}, nil
}

// List returns a conversation's files.
func (s *Service) List(ctx context.Context, cid string) ([]runbox.FileInfo, error) {
	key, err := runs.ConversationKey(ctx, cid)
	if err != nil {
		return nil, err
	}
	entries, err := s.files.List(ctx, key)
	if err != nil {
		return nil, err
	}
	out := make([]runbox.FileInfo, len(entries))
	for i, e := range entries {
		out[i] = s.info(key, e)
	}
	return out, nil
}

// Kind is how read_file returns a file.
type Kind int

const (
	Text Kind = iota + 1
	Image
	Binary
)

// File is a file's content, for read_file.
type File struct {
	runbox.FileInfo
	Kind Kind
	// ContentType is sniffed from the content: images are sent as what
	// they are, whatever their name says.
	ContentType string
	Data        []byte
}

// TooLargeError reports a file too large to return inline; URL downloads
// it.
type TooLargeError struct {
	Err  *runbox.Error
	URL  string
	Size int64
}

func (e *TooLargeError) Error() string { return e.Err.Error() }
func (e *TooLargeError) Unwrap() error { return e.Err }

// Read returns a conversation's file. name may also be a path under /data.
func (s *Service) Read(ctx context.Context, cid, name string) (File, error) {
	key, err := runs.ConversationKey(ctx, cid)
	if err != nil {
		return File{}, err
	}
	name, err = runbox.CleanFileName(name)
	if err != nil {
		return File{}, err
	}
	f, info, err := s.files.Open(ctx, key, name)
	if err != nil {
		return File{}, err
	}
	defer f.Close()
	fi := s.info(key, info)
	if info.Size > s.limits.MaxRead {
		return File{}, &TooLargeError{
			Err: runbox.Errorf(runbox.EArtifactTooLarge, "%s is %d bytes, more than the %d returned inline; download it from url",
				name, info.Size, s.limits.MaxRead),
			URL:  fi.URL,
			Size: info.Size,
		}
	}
	data, err := io.ReadAll(io.LimitReader(f, s.limits.MaxRead+1))
	if err != nil {
		return File{}, fmt.Errorf("read file: %w", err)
	}
	kind, ctype := classify(data)
	return File{FileInfo: fi, Kind: kind, ContentType: ctype, Data: data}, nil
}

// imageTypes are the images clients can show a model.
var imageTypes = []string{"image/png", "image/jpeg", "image/gif", "image/webp"}

func classify(data []byte) (Kind, string) {
	ctype := http.DetectContentType(data)
	for _, t := range imageTypes {
		if ctype == t {
			return Image, ctype
		}
	}
	if utf8.Valid(data) && !bytes.ContainsRune(data, 0) {
		return Text, ctype
	}
	return Binary, ctype
}

// Images returns the new images among a run's artifacts, for the result to
// carry as image content: at most MaxInlineImages, each at most
// MaxInlineImageBytes.
func (s *Service) Images(ctx context.Context, cid string, artifacts []runbox.FileInfo) []File {
	var out []File
	for _, a := range artifacts {
		if len(out) >= s.limits.MaxInlineImages {
			break
		}
		if !strings.HasPrefix(a.MimeType, "image/") || a.SizeBytes > s.limits.MaxInlineImageBytes {
			continue
		}
		f, err := s.Read(ctx, cid, a.Name)
		if err != nil || f.Kind != Image {
			continue
		}
		out = append(out, f)
	}
	return out
}

// awaitEnd waits for runs ids to end, up to s.closeWait; it is EBusy if
// one has not.
func (s *Service) awaitEnd(ctx context.Context, ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	wctx, cancel := context.WithTimeout(ctx, s.closeWait)
	defer cancel()
	for _, id := range ids {
		if _, err := s.runs.Wait(wctx, id, 0, nil); err != nil && !errors.Is(err, runbox.ErrRunNotFound) {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			break // the rest are looked at below
		}
	}
	for _, id := range ids {
		run, err := s.store.Run(ctx, id)
		if errors.Is(err, runbox.ErrRunNotFound) {
			continue
		}
		if err != nil {
			return err
		}
		if !run.Status.Final() {
			return runbox.Errorf(runbox.EBusy, "the conversation's runs are still stopping; close it again in a minute")
		}
	}
	return nil
}

// ErrClosed reports a conversation that has neither files nor runs still
// going: never made, or closed already.
var ErrClosed = runbox.Errorf(runbox.ENotFound, "no such conversation: it was never used or is closed already")

// Close ends a conversation: its runs are cancelled (waiting ones first),
// and its files deleted. A conversation with neither files nor runs still
// going is ErrClosed.
func (s *Service) Close(ctx context.Context, cid string) error {
	key, err := runs.ConversationKey(ctx, cid)
	if err != nil {
		return err
	}
	list, err := s.store.RecentRuns(ctx, "", key, 1000)
	if err != nil {
		return err
	}
	exists, err := s.files.Exists(ctx, key)
	if err != nil {
		return err
	}
	if !exists && !slices.ContainsFunc(list, func(r runbox.Run) bool { return !r.Status.Final() }) {
		return ErrClosed
	}
	// Newest first: the waiting runs go before the running head, which
	// then has nothing to hand on to.
	var stopping []string
	for _, r := range list {
		if r.Status.Final() {
			continue
		}
		status, err := s.runs.Cancel(ctx, r.ID)
		if err != nil && !errors.Is(err, runbox.ErrRunNotFound) {
			return err
		}
		if err == nil && !status.Final() {
			stopping = append(stopping, r.ID)
		}
	}
	// A run ends after its files are saved (with a remote file store, a
	// push that can take a while): one still ending would put back what
	// is removed here. Its files stay until a later close.
	if err := s.awaitEnd(ctx, stopping); err != nil {
		return err
	}
	// The executors drop its warm sandboxes; one that has not yet would
	// not be used again, as it mounts the folder removed here.
	if err := s.store.PublishClosed(ctx, key); err != nil {
		return err
	}
	return s.files.Remove(ctx, key)
}
