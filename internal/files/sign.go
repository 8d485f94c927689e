package files

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"mime"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/runbox-dev/runbox"
)

// Signer makes and checks download URLs:
// <base>/files/<conv>/<name>?exp=<unix>&sig=<hex HMAC-SHA256 of "<conv>/<name>\n<exp>">,
// where <conv> is the conversation's URL path: its id for the client
// "default", "~<client>/<id>" for another (runbox.ConversationURLPath).
type Signer struct {
	secret []byte
	base   string
	ttl    time.Duration
	now    func() time.Time
}

// NewSigner signs with secret URLs under base that live for ttl.
func NewSigner(secret []byte, base string, ttl time.Duration) *Signer {
	return &Signer{secret: secret, base: strings.TrimRight(base, "/"), ttl: ttl, now: time.Now}
}

func (s *Signer) mac(key, name string, exp int64) []byte {
	h := hmac.New(sha256.New, s.secret)
	fmt.Fprintf(h, "%s/%s\n%d", runbox.ConversationURLPath(key), name, exp)
	return h.Sum(nil)
}

// URL returns a signed download URL for a file of the conversation key.
func (s *Signer) URL(key, name string) string {
	exp := s.now().Add(s.ttl).Unix()
	segs := strings.Split(runbox.ConversationURLPath(key)+"/"+name, "/")
	for i, seg := range segs {
		segs[i] = url.PathEscape(seg)
	}
	return fmt.Sprintf("%s/files/%s?exp=%d&sig=%s", s.base, strings.Join(segs, "/"),
		exp, hex.EncodeToString(s.mac(key, name, exp)))
}

// Info describes a file of the conversation key as clients see it: where
// programs find it, and a fresh download URL.
func (s *Signer) Info(key string, e Entry) runbox.FileInfo {
	return runbox.FileInfo{
		Name:      e.Name,
		Path:      "/data/" + e.Name,
		SizeBytes: e.Size,
		MimeType:  MimeType(e.Name),
		URL:       s.URL(key, e.Name),
	}
}

// ParseURLPath splits the escaped path of a download URL after /files/
// into the conversation's key and the file's name.
func ParseURLPath(escaped string) (key, name string, ok bool) {
	p, err := url.PathUnescape(escaped)
	if err != nil {
		return "", "", false
	}
	client, rest := runbox.DefaultClient, p
	if r, named := strings.CutPrefix(p, "~"); named {
		client, rest, ok = strings.Cut(r, "/")
		if !ok || client == runbox.DefaultClient || !runbox.ValidClientName(client) {
			return "", "", false
		}
	}
	id, name, ok := strings.Cut(rest, "/")
	if !ok {
		return "", "", false
	}
	key, err = runbox.ConversationKey(client, id)
	if err != nil {
		return "", "", false
	}
	return key, name, true
}

// Verify reports whether sig signs the file name of the conversation key
// until exp and exp has not passed. The comparison takes constant time.
func (s *Signer) Verify(key, name, exp, sig string) bool {
	e, err := strconv.ParseInt(exp, 10, 64)
	if err != nil || s.now().Unix() > e {
		return false
	}
	got, err := hex.DecodeString(sig)
	if err != nil {
		return false
	}
	return hmac.Equal(got, s.mac(key, name, e))
}

// LoadOrCreateSecret returns the key kept in file, making a random one the
// first time, so that links survive a restart.
func LoadOrCreateSecret(file string) ([]byte, error) {
	b, err := os.ReadFile(file)
	if err == nil && len(b) >= 32 {
		return b, nil
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("read file secret: %w", err)
	}
	secret := []byte(rand.Text() + rand.Text())
	if err := os.MkdirAll(filepath.Dir(file), 0o711); err != nil {
		return nil, fmt.Errorf("store file secret: %w", err)
	}
	f, err := os.OpenFile(file, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		// Another process made it first.
		return os.ReadFile(file)
	}
	if err != nil {
		return nil, fmt.Errorf("store file secret: %w", err)
	}
	defer f.Close()
	if _, err := f.Write(secret); err != nil {
		return nil, fmt.Errorf("store file secret: %w", err)
	}
	return secret, nil
}

// types are the MIME types of files programs usually write. They do not
// depend on the host's mime.types.
var types = map[string]string{
	".csv":     "text/csv; charset=utf-8",
	".tsv":     "text/tab-separated-values; charset=utf-8",
	".txt":     "text/plain; charset=utf-8",
	".log":     "text/plain; charset=utf-8",
	".md":      "text/markdown; charset=utf-8",
	".json":    "application/json",
	".xml":     "application/xml",
	".html":    "text/html; charset=utf-8",
	".py":      "text/x-python; charset=utf-8",
	".ts":      "text/plain; charset=utf-8",
	".js":      "text/javascript; charset=utf-8",
	".sh":      "text/x-shellscript; charset=utf-8",
	".yaml":    "application/yaml",
	".yml":     "application/yaml",
	".png":     "image/png",
	".jpg":     "image/jpeg",
	".jpeg":    "image/jpeg",
	".gif":     "image/gif",
	".webp":    "image/webp",
	".svg":     "image/svg+xml",
	".pdf":     "application/pdf",
	".xlsx":    "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
	".xls":     "application/vnd.ms-excel",
	".docx":    "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
	".pptx":    "application/vnd.openxmlformats-officedocument.presentationml.presentation",
	".zip":     "application/zip",
	".gz":      "application/gzip",
	".parquet": "application/vnd.apache.parquet",
}

// MimeType returns the MIME type of a file by its name.
func MimeType(name string) string {
	ext := strings.ToLower(path.Ext(name))
	if t, ok := types[ext]; ok {
		return t
	}
	if t := mime.TypeByExtension(ext); t != "" {
		return t
	}
	return "application/octet-stream"
}
