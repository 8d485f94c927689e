package envd

import (
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"connectrpc.com/connect"
)

// The /files routes read and write whole files, streamed both ways: a
// download is copied from the file as the client reads, an upload (a
// multipart body of "file" parts, or one octet-stream body, gzip-encoded
// or not) is written as it comes. Their bound is the api's, which caps
// an upload's body before it reaches the sandbox, and the conversation's
// quota, which the kernel holds.

// writtenEntry is one file an upload wrote, as E2B's envd answers it.
type writtenEntry struct {
	Path     string            `json:"path"`
	Name     string            `json:"name"`
	Type     string            `json:"type"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

// apiError is an error answer of the /files routes.
type apiError struct {
	Message string `json:"message"`
	Code    int    `json:"code"`
}

func writeError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(apiError{Message: msg, Code: status})
}

// writeFSError answers err, a file system error about a path.
func writeFSError(w http.ResponseWriter, err error) {
	status := http.StatusInternalServerError
	switch connect.CodeOf(fsError(err)) {
	case connect.CodeNotFound:
		status = http.StatusNotFound
	case connect.CodeInvalidArgument, connect.CodeAlreadyExists:
		status = http.StatusBadRequest
	case connect.CodePermissionDenied:
		status = http.StatusForbidden
	case connect.CodeResourceExhausted:
		status = http.StatusInsufficientStorage
	}
	writeError(w, status, err.Error())
}

// fileRequest checks a /files request's user and resolves its path.
func (s *Server) fileRequest(w http.ResponseWriter, r *http.Request, name string) (string, bool) {
	user := r.URL.Query().Get("username")
	if user == "" {
		user = basicUser(r.Header.Get("Authorization"))
	}
	if err := s.checkName(user); err != nil {
		writeError(w, http.StatusUnauthorized, connectMessage(err))
		return "", false
	}
	p, err := s.paths.resolve(name)
	if err != nil {
		writeError(w, http.StatusBadRequest, connectMessage(err))
		return "", false
	}
	return p, true
}

func connectMessage(err error) string {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce.Message()
	}
	return err.Error()
}

// download serves GET /files?path=: the file's bytes, gzip-encoded when
// the client accepts it.
func (s *Server) download(w http.ResponseWriter, r *http.Request) {
	p, ok := s.fileRequest(w, r, r.URL.Query().Get("path"))
	if !ok {
		return
	}
	f, err := os.Open(p)
	if err != nil {
		writeFSError(w, err)
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		writeFSError(w, err)
		return
	}
	if !fi.Mode().IsRegular() {
		writeError(w, http.StatusBadRequest, "the path is not a file")
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": filepath.Base(p)}))
	var out io.Writer = w
	if acceptsGzip(r) {
		h.Set("Content-Encoding", "gzip")
		gz := gzip.NewWriter(w)
		defer gz.Close()
		out = gz
	} else {
		h.Set("Content-Length", fmt.Sprint(fi.Size()))
	}
	w.WriteHeader(http.StatusOK)
	_, _ = io.Copy(out, f)
}

func acceptsGzip(r *http.Request) bool {
	for part := range strings.SplitSeq(r.Header.Get("Accept-Encoding"), ",") {
		enc, _, _ := strings.Cut(strings.TrimSpace(part), ";")
		if strings.EqualFold(enc, "gzip") {
			return true
		}
	}
	return false
}

// upload serves POST /files: the body's files written where they say.
func (s *Server) upload(w http.ResponseWriter, r *http.Request) {
	md, err := metadataOf(r.Header)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	body := io.Reader(r.Body)
	if strings.EqualFold(r.Header.Get("Content-Encoding"), "gzip") {
		gz, err := gzip.NewReader(r.Body)
		if err != nil {
			writeError(w, http.StatusBadRequest, "the body is not gzip")
			return
		}
		defer gz.Close()
		body = gz
	}
	var written []writtenEntry
	switch ct {
	case "multipart/form-data":
		written, err = s.uploadParts(w, r, md)
	default:
		var e writtenEntry
		var p string
		var ok bool
		if p, ok = s.fileRequest(w, r, r.URL.Query().Get("path")); !ok {
			return
		}
		e, err = s.writeFile(p, body, md)
		written = []writtenEntry{e}
	}
	if err != nil {
		if !errors.Is(err, errAnswered) {
			writeFSError(w, err)
		}
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(written)
}

// errAnswered says that the request was answered already.
var errAnswered = errors.New("answered")

// uploadParts writes a multipart body's "file" parts, one at a time as
// they come: each to the request's path when it names one (and the body
// holds one file), else to the part's file name.
func (s *Server) uploadParts(w http.ResponseWriter, r *http.Request, md map[string]string) ([]writtenEntry, error) {
	mr, err := r.MultipartReader()
	if err != nil {
		writeError(w, http.StatusBadRequest, "the body is not multipart")
		return nil, errAnswered
	}
	query := r.URL.Query().Get("path")
	var written []writtenEntry
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			writeError(w, http.StatusBadRequest, "the multipart body is malformed")
			return nil, errAnswered
		}
		if part.FormName() != "file" {
			part.Close()
			continue
		}
		name := query
		if name == "" || len(written) > 0 {
			name = rawFileName(part.Header.Get("Content-Disposition"))
		}
		p, ok := s.fileRequest(w, r, name)
		if !ok {
			return nil, errAnswered
		}
		e, err := s.writeFile(p, part, md)
		part.Close()
		if err != nil {
			return nil, err
		}
		written = append(written, e)
	}
	if len(written) == 0 {
		writeError(w, http.StatusBadRequest, "the body holds no file part")
		return nil, errAnswered
	}
	return written, nil
}

// rawFileName is a part's filename parameter as sent: a path, which
// mime/multipart's FileName would cut to its last element.
func rawFileName(disposition string) string {
	_, params, err := mime.ParseMediaType(disposition)
	if err != nil {
		return ""
	}
	return params["filename"]
}

// writeFile writes r to the file at p, making its folders, and sets its
// metadata. As E2B's envd does, the file is created, then its owner set,
// then written: a watcher sees a create, a chmod and a write.
func (s *Server) writeFile(p string, r io.Reader, md map[string]string) (writtenEntry, error) {
	made, err := mkdirAll(filepath.Dir(p))
	if err != nil {
		return writtenEntry{}, err
	}
	s.watch.madeDirs(made)
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o666)
	if err != nil {
		return writtenEntry{}, err
	}
	_ = f.Chown(os.Getuid(), os.Getgid())
	_, err = io.Copy(f, r)
	if err == nil {
		err = writeMetadata(f, md)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return writtenEntry{}, err
	}
	return writtenEntry{Path: s.paths.show(p), Name: filepath.Base(p), Type: "file", Metadata: readMetadata(p)}, nil
}

// metadataOf reads an upload's X-Metadata-* headers: keys lower case,
// each the first value sent, all printable ASCII, within the bounds.
func metadataOf(h http.Header) (map[string]string, error) {
	var md map[string]string
	total := 0
	for name, values := range h {
		key, ok := cutPrefixFold(name, "X-Metadata-")
		if !ok || len(values) == 0 {
			continue
		}
		key = strings.ToLower(key)
		val := values[0]
		switch {
		case key == "" || !printable(key) || !printable(val):
			return nil, errors.New("metadata keys and values must be printable ASCII")
		case len(key) > maxMetadataKey:
			return nil, fmt.Errorf("a metadata key is longer than %d bytes", maxMetadataKey)
		}
		total += len(metadataPrefix) + len(key) + len(val)
		if total > maxMetadataBytes {
			return nil, fmt.Errorf("the metadata is larger than %d bytes", maxMetadataBytes)
		}
		if md == nil {
			md = map[string]string{}
		}
		md[key] = val
	}
	return md, nil
}

func cutPrefixFold(s, prefix string) (string, bool) {
	if len(s) < len(prefix) || !strings.EqualFold(s[:len(prefix)], prefix) {
		return "", false
	}
	return s[len(prefix):], true
}

func printable(s string) bool {
	for i := range len(s) {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}
