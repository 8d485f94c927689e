package gitexport

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path"
	"sort"
	"strings"
	"time"

	"github.com/go-git/go-billy/v5/osfs"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/cache"
	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/plumbing/format/packfile"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/plumbing/protocol/packp"
	"github.com/go-git/go-git/v5/plumbing/protocol/packp/capability"
	"github.com/go-git/go-git/v5/plumbing/protocol/packp/sideband"
	"github.com/go-git/go-git/v5/plumbing/storer"
	"github.com/go-git/go-git/v5/plumbing/transport"
	githttp "github.com/go-git/go-git/v5/plumbing/transport/http"
	"github.com/go-git/go-git/v5/storage/filesystem"

	"github.com/runbox-dev/runbox"
)

// A commit goes to a forge the way git pushes, over the smart HTTP
// protocol, whatever the forge: the same code serves GitHub and Gitea,
// and the tests run it against a real Gitea.
//
//  1. The receive-pack advertisement (what `git push` asks first) lists
//     the branches; a token that may not push is refused here, before
//     anything is written.
//  2. The commit the new one goes on (the branch's tip, or the base
//     branch's when the branch is new) is fetched alone, depth 1, into a
//     temporary folder: its tree is what the new tree starts from.
//  3. The files become blobs, the folders on their paths new trees, and
//     one commit holds them all, however many files there are.
//  4. A pack of exactly the new objects is sent with one ref update whose
//     old value is the tip the commit was built on: if the branch moved
//     meanwhile, the forge refuses it and it is built again.

// gitRemote is a repository's git endpoint and the token that opens it.
type gitRemote struct {
	endpoint  *transport.Endpoint
	auth      *githttp.BasicAuth
	transport transport.Transport
	// tempDir holds the fetched commit while a push is built.
	tempDir string
}

// session returns the endpoint for one session: a copy, as go-git's
// HTTP session rewrites its endpoint (following a redirect), and pushes
// of one repository run side by side.
func (g *gitRemote) session() *transport.Endpoint {
	ep := *g.endpoint
	return &ep
}

// gitUser is the user name sent with a token: GitHub wants one, any
// will do, and Gitea takes the token from the password.
const gitUser = "x-access-token"

func newGitRemote(r *Repo, hc *http.Client, tempDir string) (*gitRemote, error) {
	ep, err := transport.NewEndpoint(r.URL)
	if err != nil {
		return nil, fmt.Errorf("repository %s: %w", r.ID, err)
	}
	return &gitRemote{
		endpoint:  ep,
		auth:      &githttp.BasicAuth{Username: gitUser, Password: r.Token.Reveal()},
		transport: githttp.NewClient(hc),
		tempDir:   tempDir,
	}, nil
}

// File is a file of a commit.
type File struct {
	Path string // checked by rules.Path
	Data []byte
}

// Commit is what Push writes: one commit of Files on Branch, made from
// Base's tip when Branch does not exist yet.
type Commit struct {
	Branch, Base      string
	Files             []File
	Message           string
	Author, Committer Signature
	When              time.Time
	// Owner, when set, is the client Branch must belong to if it exists:
	// its tip must be a commit runbox made for Owner (its trailers), or
	// the push is refused (errNotOwner). The forge's ref update, made
	// only from the tip that was checked, keeps that true until the push
	// lands.
	Owner string
}

// pushAttempts bounds how often a push is built again because its branch
// moved while it was being built.
const pushAttempts = 3

// canPush asks for the receive-pack advertisement: only a token that may
// push gets it.
func (g *gitRemote) canPush(ctx context.Context) error {
	sess, err := g.transport.NewReceivePackSession(g.session(), g.auth)
	if err != nil {
		return gitError("push", err)
	}
	defer sess.Close()
	if _, err := sess.AdvertisedReferencesContext(ctx); err != nil {
		return gitError("push", err)
	}
	return nil
}

// push writes c as one commit and returns its hash.
func (g *gitRemote) push(ctx context.Context, c Commit) (string, error) {
	for attempt := 1; ; attempt++ {
		sha, err := g.pushOnce(ctx, c)
		if !errors.Is(err, errMoved) || attempt == pushAttempts {
			return sha, err
		}
	}
}

// errMoved reports a branch that moved between the fetch and the push.
var errMoved = runbox.Errorf(runbox.EUnavailable, "the branch kept changing while the commit was made; try again")

// pushOnce fetches the tip c goes onto, builds c on it and pushes it,
// provided the branch has not moved meanwhile.
func (g *gitRemote) pushOnce(ctx context.Context, c Commit) (string, error) {
	sess, err := g.transport.NewReceivePackSession(g.session(), g.auth)
	if err != nil {
		return "", gitError("push", err)
	}
	defer sess.Close()
	adv, err := sess.AdvertisedReferencesContext(ctx)
	if err != nil {
		return "", gitError("push", err)
	}
	refs, err := adv.AllReferences()
	if err != nil {
		return "", fmt.Errorf("advertised references: %w", err)
	}
	branchRef := plumbing.NewBranchReferenceName(c.Branch)
	var old, start plumbing.Hash
	if ref, ok := refs[branchRef]; ok {
		old, start = ref.Hash(), ref.Hash()
	} else if ref, ok := refs[plumbing.NewBranchReferenceName(c.Base)]; ok {
		start = ref.Hash()
	} else {
		return "", runbox.Errorf(runbox.EInvalidBranch, "the base branch %s does not exist in the repository", c.Base)
	}

	dir, err := os.MkdirTemp(g.tempDir, "runbox-git-")
	if err != nil {
		return "", fmt.Errorf("temporary folder: %w", err)
	}
	defer os.RemoveAll(dir)
	st := filesystem.NewStorage(osfs.New(dir), cache.NewObjectLRUDefault())
	defer st.Close()
	b, sha, err := g.build(ctx, st, c, start, !old.IsZero())
	if err != nil {
		return "", err
	}
	var pack bytes.Buffer
	if _, err := packfile.NewEncoder(&pack, st, false).Encode(b.made, 0); err != nil {
		return "", fmt.Errorf("encode the pack: %w", err)
	}
	req := packp.NewReferenceUpdateRequestFromCapabilities(adv.Capabilities)
	req.Commands = []*packp.Command{{Name: branchRef, Old: old, New: sha}}
	req.Packfile = io.NopCloser(&pack)
	if err := receivePack(ctx, sess, req); err != nil {
		return "", err
	}
	return sha.String(), nil
}

// build fetches start into st and makes c on it: the commit and the
// trees it changes, in the builder. On a branch that exists (onBranch),
// start is its tip, which must be a commit made for c.Owner.
func (g *gitRemote) build(ctx context.Context, st *filesystem.Storage, c Commit, start plumbing.Hash, onBranch bool) (*builder, plumbing.Hash, error) {
	if err := g.fetchCommit(ctx, st, start); err != nil {
		return nil, plumbing.ZeroHash, err
	}
	parent, err := object.GetCommit(st, start)
	if err != nil {
		return nil, plumbing.ZeroHash, fmt.Errorf("fetched commit: %w", err)
	}
	if c.Owner != "" && onBranch && madeFor(parent.Message) != c.Owner {
		return nil, plumbing.ZeroHash, errNotOwner
	}
	b := &builder{st: st}
	changes := make(map[string][]byte, len(c.Files))
	for _, f := range c.Files {
		changes[f.Path] = f.Data
	}
	tree, err := b.tree(parent.TreeHash, changes, "")
	if err != nil {
		return nil, plumbing.ZeroHash, err
	}
	sha, err := b.store(&object.Commit{
		Author:       object.Signature{Name: c.Author.Name, Email: c.Author.Email, When: c.When},
		Committer:    object.Signature{Name: c.Committer.Name, Email: c.Committer.Email, When: c.When},
		Message:      c.Message,
		TreeHash:     tree,
		ParentHashes: []plumbing.Hash{start},
	})
	return b, sha, err
}

// receivePack sends req. The report comes with the error it holds: a ref
// update refused with a sound pack is a branch that moved (or was made)
// meanwhile ("stale info", "fetch first", "failed to update ref", as each
// server words it).
func receivePack(ctx context.Context, sess transport.ReceivePackSession, req *packp.ReferenceUpdateRequest) error {
	report, err := sess.ReceivePack(ctx, req)
	switch {
	case err == nil:
		return nil
	case report != nil && report.UnpackStatus == "ok":
		return fmt.Errorf("%w (%v)", errMoved, err)
	case report != nil:
		return &forgeError{op: "push", err: fmt.Errorf("the forge refused the pack: %w", err)}
	}
	return gitError("push", err)
}

// fetchCommit fetches one commit and its tree (depth 1) into st.
func (g *gitRemote) fetchCommit(ctx context.Context, st *filesystem.Storage, h plumbing.Hash) error {
	sess, err := g.transport.NewUploadPackSession(g.session(), g.auth)
	if err != nil {
		return gitError("fetch", err)
	}
	defer sess.Close()
	adv, err := sess.AdvertisedReferencesContext(ctx)
	if err != nil {
		return gitError("fetch", err)
	}
	req := packp.NewUploadPackRequestFromCapabilities(adv.Capabilities)
	req.Wants = []plumbing.Hash{h}
	req.Depth = packp.DepthCommits(1)
	if err := req.Capabilities.Set(capability.Shallow); err != nil {
		return fmt.Errorf("fetch: %w", err)
	}
	if adv.Capabilities.Supports(capability.NoProgress) {
		_ = req.Capabilities.Set(capability.NoProgress)
	}
	resp, err := sess.UploadPack(ctx, req)
	if err != nil {
		return gitError("fetch", err)
	}
	defer resp.Close()
	var r io.Reader = resp
	switch {
	case req.Capabilities.Supports(capability.Sideband64k):
		r = sideband.NewDemuxer(sideband.Sideband64k, resp)
	case req.Capabilities.Supports(capability.Sideband):
		r = sideband.NewDemuxer(sideband.Sideband, resp)
	}
	if err := packfile.UpdateObjectStorage(st, r); err != nil {
		return gitError("fetch", err)
	}
	return nil
}

// builder writes new objects and remembers them, for the pack.
type builder struct {
	st   storer.EncodedObjectStorer
	made []plumbing.Hash
}

func (b *builder) store(o interface {
	Encode(plumbing.EncodedObject) error
}) (plumbing.Hash, error) {
	obj := b.st.NewEncodedObject()
	if err := o.Encode(obj); err != nil {
		return plumbing.ZeroHash, fmt.Errorf("encode an object: %w", err)
	}
	h, err := b.st.SetEncodedObject(obj)
	if err != nil {
		return plumbing.ZeroHash, fmt.Errorf("store an object: %w", err)
	}
	b.made = append(b.made, h)
	return h, nil
}

func (b *builder) blob(data []byte) (plumbing.Hash, error) {
	obj := b.st.NewEncodedObject()
	obj.SetType(plumbing.BlobObject)
	obj.SetSize(int64(len(data)))
	w, err := obj.Writer()
	if err != nil {
		return plumbing.ZeroHash, err
	}
	if _, err := w.Write(data); err != nil {
		return plumbing.ZeroHash, err
	}
	if err := w.Close(); err != nil {
		return plumbing.ZeroHash, err
	}
	h, err := b.st.SetEncodedObject(obj)
	if err != nil {
		return plumbing.ZeroHash, fmt.Errorf("store a blob: %w", err)
	}
	b.made = append(b.made, h)
	return h, nil
}

// tree returns the tree base (zero: an empty one) with changes (paths
// relative to it) written in; dir is where it is, for messages.
func (b *builder) tree(base plumbing.Hash, changes map[string][]byte, dir string) (plumbing.Hash, error) {
	entries := map[string]object.TreeEntry{}
	if !base.IsZero() {
		t, err := object.GetTree(b.st, base)
		if err != nil {
			return plumbing.ZeroHash, fmt.Errorf("tree of %q: %w", dir, err)
		}
		for _, e := range t.Entries {
			entries[e.Name] = e
		}
	}
	files, subdirs := map[string][]byte{}, map[string]map[string][]byte{}
	for p, data := range changes {
		first, rest, nested := strings.Cut(p, "/")
		if !nested {
			files[first] = data
			continue
		}
		if subdirs[first] == nil {
			subdirs[first] = map[string][]byte{}
		}
		subdirs[first][rest] = data
	}
	for name, data := range files {
		if _, clash := subdirs[name]; clash {
			return plumbing.ZeroHash, runbox.Errorf(runbox.EInvalid, "%s is both a file and a folder in this commit", path.Join(dir, name))
		}
		mode := filemode.Regular
		if e, ok := entries[name]; ok {
			switch e.Mode {
			case filemode.Dir, filemode.Submodule:
				return plumbing.ZeroHash, runbox.Errorf(runbox.EInvalid, "%s is a folder in the branch, not a file", path.Join(dir, name))
			case filemode.Executable:
				mode = filemode.Executable // an executable stays one
			}
		}
		h, err := b.blob(data)
		if err != nil {
			return plumbing.ZeroHash, err
		}
		entries[name] = object.TreeEntry{Name: name, Mode: mode, Hash: h}
	}
	for name, sub := range subdirs {
		var subBase plumbing.Hash
		if e, ok := entries[name]; ok {
			if e.Mode != filemode.Dir {
				return plumbing.ZeroHash, runbox.Errorf(runbox.EInvalid, "%s is a file in the branch, not a folder", path.Join(dir, name))
			}
			subBase = e.Hash
		}
		h, err := b.tree(subBase, sub, path.Join(dir, name))
		if err != nil {
			return plumbing.ZeroHash, err
		}
		entries[name] = object.TreeEntry{Name: name, Mode: filemode.Dir, Hash: h}
	}
	t := &object.Tree{Entries: make([]object.TreeEntry, 0, len(entries))}
	for _, e := range entries {
		t.Entries = append(t.Entries, e)
	}
	// git orders a tree's entries by name, a folder's name as if it
	// ended in '/'.
	key := func(e object.TreeEntry) string {
		if e.Mode == filemode.Dir {
			return e.Name + "/"
		}
		return e.Name
	}
	sort.Slice(t.Entries, func(i, j int) bool { return key(t.Entries[i]) < key(t.Entries[j]) })
	return b.store(t)
}

// gitError turns what the git transport reports into the gateway's
// codes. The forge's own words go to the log only (with the operation),
// never to a client.
func gitError(op string, err error) error {
	if err == nil {
		return nil
	}
	if _, ok := errors.AsType[*runbox.Error](err); ok {
		return err
	}
	status := 0
	var ue *plumbing.UnexpectedError
	if errors.As(err, &ue) {
		if he, ok := ue.Err.(*githttp.Err); ok {
			status = he.StatusCode()
		}
	}
	switch {
	case errors.Is(err, transport.ErrAuthenticationRequired):
		status = http.StatusUnauthorized
	case errors.Is(err, transport.ErrAuthorizationFailed):
		status = http.StatusForbidden
	case errors.Is(err, transport.ErrRepositoryNotFound):
		status = http.StatusNotFound
	}
	return &forgeError{op: op, status: status, err: err}
}
