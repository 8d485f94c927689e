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
	"strings"
	"unicode/utf8"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/files"
	"github.com/runbox-dev/runbox/internal/runs"
	"github.com/runbox-dev/runbox/internal/store"
)

// Limits bound what clients send and get.
type Limits struct {
	MaxUpload           int64
	MaxRead             int64
	MaxInlineImages     int
	MaxInlineImageBytes int64
}

// Service serves conversations' files.
type Service struct {
	folders *files.Folders
	signer  *files.Signer
	runs    *runs.Service
	store   *store.Store
	limits  Limits
}

// NewService returns a Service.
func NewService(folders *files.Folders, signer *files.Signer, rs *runs.Service, st *store.Store, limits Limits) *Service {
	return &Service{folders: folders, signer: signer, runs: rs, store: st, limits: limits}
}

// Limits returns the service's limits.
func (s *Service) Limits() Limits { return s.limits }

// Info describes a file of a conversation, with a fresh download URL.
func (s *Service) Info(cid string, e files.Entry) runbox.FileInfo {
	return runbox.FileInfo{
		Name:      e.Name,
		Path:      "/data/" + e.Name,
		SizeBytes: e.Size,
		MimeType:  files.MimeType(e.Name),
		URL:       s.signer.URL(cid, e.Name),
	}
}

// Uploaded is what upload_file returns.
type Uploaded struct {
	ConversationID string `json:"conversationId"`
	runbox.FileInfo
}

// Upload stores r as the file name of conversation cid (made when empty).
func (s *Service) Upload(cid, name string, r io.Reader, overwrite bool) (Uploaded, error) {
	if cid == "" {
		cid = runs.NewConversationID()
	}
	if !runbox.ValidConversationID(cid) {
		return Uploaded{}, runbox.Errorf(runbox.EInvalid, "conversationId must be 1 to 64 letters, digits, '_' or '-'")
	}
	e, err := s.folders.Write(cid, name, r, s.limits.MaxUpload, overwrite)
	if err != nil {
		return Uploaded{}, err
	}
	return Uploaded{ConversationID: cid, FileInfo: s.Info(cid, e)}, nil
}

// List returns a conversation's files.
func (s *Service) List(cid string) ([]runbox.FileInfo, error) {
	if !runbox.ValidConversationID(cid) {
		return nil, runbox.Errorf(runbox.EInvalid, "conversationId must be 1 to 64 letters, digits, '_' or '-'")
	}
	entries, err := s.folders.List(cid)
	if err != nil {
		return nil, err
	}
	out := make([]runbox.FileInfo, len(entries))
	for i, e := range entries {
		out[i] = s.Info(cid, e)
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
	Err *runbox.Error
	URL string
}

func (e *TooLargeError) Error() string { return e.Err.Error() }
func (e *TooLargeError) Unwrap() error { return e.Err }

// Read returns a conversation's file. name may also be a path under /data.
func (s *Service) Read(cid, name string) (File, error) {
	if !runbox.ValidConversationID(cid) {
		return File{}, runbox.Errorf(runbox.EInvalid, "conversationId must be 1 to 64 letters, digits, '_' or '-'")
	}
	name, err := files.CleanName(name)
	if err != nil {
		return File{}, err
	}
	f, info, err := s.folders.Open(cid, name)
	if err != nil {
		return File{}, err
	}
	defer f.Close()
	fi := s.Info(cid, files.Entry{Name: name, Size: info.Size(), ModTime: info.ModTime()})
	if info.Size() > s.limits.MaxRead {
		return File{}, &TooLargeError{
			Err: runbox.Errorf(runbox.EArtifactTooLarge, "%s is %d bytes, more than the %d returned inline; download it from url",
				name, info.Size(), s.limits.MaxRead),
			URL: fi.URL,
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
func (s *Service) Images(cid string, artifacts []runbox.FileInfo) []File {
	var out []File
	for _, a := range artifacts {
		if len(out) >= s.limits.MaxInlineImages {
			break
		}
		if !strings.HasPrefix(a.MimeType, "image/") || a.SizeBytes > s.limits.MaxInlineImageBytes {
			continue
		}
		f, err := s.Read(cid, a.Name)
		if err != nil || f.Kind != Image {
			continue
		}
		out = append(out, f)
	}
	return out
}

// Close ends a conversation: its runs are cancelled (waiting ones first),
// and its files deleted.
func (s *Service) Close(ctx context.Context, cid string) error {
	if !runbox.ValidConversationID(cid) {
		return runbox.Errorf(runbox.EInvalid, "conversationId must be 1 to 64 letters, digits, '_' or '-'")
	}
	list, err := s.store.Runs(ctx, cid, 1000)
	if err != nil {
		return err
	}
	// Newest first: the waiting runs go before the running head, which
	// then has nothing to hand on to.
	for _, r := range list {
		if r.Status.Final() {
			continue
		}
		if _, err := s.runs.Cancel(ctx, r.ID); err != nil && !errors.Is(err, store.ErrNotFound) {
			return err
		}
	}
	// The executors drop its warm sandboxes; one that has not yet would
	// not be used again, as it mounts the folder removed here.
	if err := s.store.PublishClosed(ctx, cid); err != nil {
		return err
	}
	return s.folders.Remove(cid)
}
