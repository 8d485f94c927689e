package preview

import (
	"context"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/link"
)

// Key derives the key capabilities are signed with from the deployment's
// shared secret: every api replica verifies what any other issued.
func Key(secret []byte) []byte {
	k, err := hkdf.Key(sha256.New, secret, nil, "runbox preview capability v1", 32)
	if err != nil {
		panic("preview: derive key: " + err.Error())
	}
	return k
}

// maxCached bounds the resolved capabilities kept in memory.
const maxCached = 10000

// Store keeps preview records and tells where conversations' sandboxes
// are (store.Previews and Executors: a *store.Store). Preview returns
// runbox.ErrPreviewNotFound for a record that does not exist.
type Store interface {
	SavePreview(ctx context.Context, id string, rec runbox.PreviewRecord, expires time.Time) error
	Preview(ctx context.Context, id string) (runbox.PreviewRecord, error)
	Owner(ctx context.Context, cid string) (string, error)
	LiveExecutors(ctx context.Context) ([]runbox.ExecutorInfo, error)
}

// Service issues and resolves preview URLs.
type Service struct {
	signer *Signer
	domain Domain
	ttl    time.Duration
	store  Store
	link   link.Link
	log    *slog.Logger
	now    func() time.Time
	// unserved: no process serves preview hosts.
	unserved bool

	mu    sync.Mutex
	cache map[string]Target // by record id; records never change
}

// Options configure a Service.
type Options struct {
	Key    []byte // Key of the shared secret
	Domain Domain
	TTL    time.Duration // PREVIEW_URL_TTL
	Store  Store
	Link   link.Link
	Logger *slog.Logger
	// Now is the clock (time.Now if nil).
	Now func() time.Time
	// Unserved says that no process of the deployment serves preview
	// hosts (api --stdio with its own Redis): URLs are not issued.
	Unserved bool
}

// NewService returns a Service.
func NewService(o Options) *Service {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return &Service{signer: NewSigner(o.Key), domain: o.Domain, ttl: o.TTL, store: o.Store, link: o.Link,
		log: o.Logger, now: o.Now, unserved: o.Unserved, cache: map[string]Target{}}
}

// Domain returns where previews are served.
func (s *Service) Domain() Domain { return s.domain }

// URL is an issued preview URL.
type URL struct {
	URL       string    `json:"url"`
	ExpiresAt time.Time `json:"expires_at"`
}

// Issue returns a preview URL for port of the conversation key, which must
// be the caller's: not_listening when no process of it listens there.
func (s *Service) Issue(ctx context.Context, key string, port int) (URL, error) {
	if s.unserved {
		return URL{}, runbox.Errorf(runbox.EUnavailable, "previews are served by the HTTP api; this stdio server has its own Redis and serves none")
	}
	if port < 1 || port > 65535 {
		return URL{}, runbox.Errorf(runbox.EInvalid, "port must be between 1 and 65535")
	}
	client, _, ok := runbox.ParseConversationKey(key)
	if !ok {
		return URL{}, runbox.Errorf(runbox.EInvalid, "invalid conversationId")
	}
	executor, sandboxes, err := s.find(ctx, key, port)
	if err != nil {
		return URL{}, err
	}
	var id [idLen]byte
	_, _ = rand.Read(id[:]) // never fails (crypto/rand)
	// Whole seconds: what the capability carries.
	expires := s.now().Add(s.ttl).Truncate(time.Second)
	rec := runbox.PreviewRecord{Client: client, Conversation: key, Executor: executor, Sandboxes: sandboxes}
	if err := s.store.SavePreview(ctx, hex.EncodeToString(id[:]), rec, expires); err != nil {
		return URL{}, err
	}
	label := s.signer.Sign(id, port, expires, client, key)
	return URL{URL: s.domain.URL(label), ExpiresAt: expires.UTC()}, nil
}

// find asks the executors, the conversation's owner first, which of them
// holds a sandbox of it where port listens.
func (s *Service) find(ctx context.Context, key string, port int) (string, []string, error) {
	owner, err := s.store.Owner(ctx, key)
	if err != nil {
		return "", nil, err
	}
	infos, err := s.store.LiveExecutors(ctx)
	if err != nil {
		return "", nil, err
	}
	candidates := []string{}
	if owner != "" {
		candidates = append(candidates, owner)
	}
	for _, in := range infos {
		if in.ID != owner {
			candidates = append(candidates, in.ID)
		}
	}
	for _, ex := range candidates {
		sandboxes, err := s.link.Probe(ctx, ex, key, port)
		switch {
		case err == nil:
			return ex, sandboxes, nil
		case errors.Is(err, link.ErrGone), errors.Is(err, link.ErrNotListening):
		default:
			// One executor that does not answer does not hide another's.
			s.log.Warn("probe a port", "executor", ex, "err", err)
		}
	}
	return "", nil, runbox.Errorf(runbox.ENotListening,
		"nothing listens on port %d in this conversation's sandbox; start a server there first (run_code with background: true, or start_run) listening on 0.0.0.0 or 127.0.0.1", port)
}

// Target is what a valid preview URL reaches.
type Target struct {
	ID           string // the record's
	Client       string
	Conversation string // key
	Executor     string
	Port         int
	Sandboxes    []string
	Expires      time.Time
}

// Resolve returns what a capability reaches, or ErrInvalid.
func (s *Service) Resolve(ctx context.Context, label string) (Target, error) {
	now := s.now()
	c, err := s.signer.Parse(label, now)
	if err != nil {
		return Target{}, err
	}
	id := hex.EncodeToString(c.ID[:])
	s.mu.Lock()
	t, ok := s.cache[id]
	s.mu.Unlock()
	if !ok {
		rec, err := s.store.Preview(ctx, id)
		if errors.Is(err, runbox.ErrPreviewNotFound) {
			return Target{}, ErrInvalid
		}
		if err != nil {
			return Target{}, fmt.Errorf("resolve preview: %w", err)
		}
		t = Target{ID: id, Client: rec.Client, Conversation: rec.Conversation, Executor: rec.Executor,
			Sandboxes: rec.Sandboxes}
	}
	// The cache is keyed by the record: the port and expiry are the
	// capability's own, and the MAC checks them with the record's names.
	if !s.signer.Verify(c, t.Client, t.Conversation) {
		return Target{}, ErrInvalid
	}
	t.Port, t.Expires = c.Port, c.Expires
	if !ok {
		s.remember(t, now)
	}
	return t, nil
}

// remember caches a verified target until it expires.
func (s *Service) remember(t Target, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.cache) >= maxCached {
		maps := s.cache
		s.cache = map[string]Target{}
		for id, c := range maps {
			if now.Before(c.Expires) && len(s.cache) < maxCached/2 {
				s.cache[id] = c
			}
		}
	}
	t.Sandboxes = slices.Clone(t.Sandboxes)
	s.cache[t.ID] = t
}
