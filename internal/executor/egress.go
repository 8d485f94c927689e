package executor

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/agent"
	"github.com/runbox-dev/runbox/internal/audit"
	"github.com/runbox-dev/runbox/internal/egress"
	"github.com/runbox-dev/runbox/internal/packages"
	"github.com/runbox-dev/runbox/internal/sandbox"
)

// Egress is how runs reach outside their sandboxes: the proxy their
// connections come to, the package indexes they install from, and the
// audit log every connection is recorded in.
type Egress struct {
	Proxy       *egress.Proxy
	PipIndexURL string
	NPMRegistry string
	Audit       *audit.Recorder
	// Secrets are the operator's secrets, with their values, which the
	// proxy puts into the requests of the runs that ask for them.
	Secrets egress.Secrets
}

// openEgress lets a run that asked for network, packages or secrets
// reach what it may: first what installing its packages may (the
// client's allowlist, without secrets), else what its program may (its
// network.allowed_domains and its secrets' domains, with the secrets:
// programGrant). Each connection becomes an event of the run and an
// audit entry. nil when it asked nothing: a run that asks nothing pays
// nothing.
func (e *Executor) openEgress(ctx context.Context, id string, spec runbox.Spec, log *slog.Logger) (*egress.Run, error) {
	if !wantsNetwork(spec) && len(spec.Packages) == 0 {
		return nil, nil
	}
	eg := e.cfg.Egress
	if eg == nil || eg.Proxy == nil {
		return nil, fmt.Errorf("the run asked for network, and this executor has no egress proxy")
	}
	grant, secrets, err := e.programGrant(spec)
	if err != nil {
		return nil, err
	}
	if len(spec.Packages) > 0 {
		if grant, err = egress.ParsePatterns(spec.PackageDomains); err != nil {
			return nil, err
		}
		secrets = nil // the program's, once they are installed
	}
	client, conv, _ := runbox.ParseConversationKey(spec.ConversationID)
	record := func(rec runbox.Egress) {
		ev := runbox.Event{TS: time.Now(), Type: runbox.EventEgress, Egress: &rec}
		if err := e.store.Append(context.WithoutCancel(ctx), id, ev); err != nil {
			log.Warn("publish an egress connection", "err", err)
		}
		if eg.Audit != nil {
			eg.Audit.Egress(ctx, client, conv, id, rec)
		}
	}
	run := eg.Proxy.Open(id, grant, record)
	run.UseSecrets(secrets)
	return run, nil
}

// wantsNetwork reports whether a run's program reaches outside its
// sandbox: it asked for domains, or for secrets (their domains).
func wantsNetwork(spec runbox.Spec) bool { return spec.Network != nil || len(spec.Secrets) > 0 }

// programGrant returns what a run's program may reach, and the secrets
// its requests carry: the domains it asked for and its secrets' domains.
func (e *Executor) programGrant(spec runbox.Spec) (egress.Patterns, []egress.Secret, error) {
	grant, err := egress.ParsePatterns(spec.Domains())
	if err != nil {
		return nil, nil, err
	}
	var secrets []egress.Secret
	if len(spec.Secrets) > 0 {
		if e.cfg.Egress == nil || e.cfg.Egress.Proxy.TrustPEM() == "" {
			return nil, nil, fmt.Errorf("the run asked for secrets, and this executor has none")
		}
		if secrets, err = e.cfg.Egress.Secrets.Pick(spec.Secrets); err != nil {
			return nil, nil, err
		}
	}
	for _, s := range secrets {
		for _, d := range s.Domains {
			if !grant.Covers(d) {
				grant = append(grant, d)
			}
		}
	}
	return grant, secrets, nil
}

// networkEnv is what a run that asked for network (or installs packages)
// finds in its environment: the proxy for ordinary tools, and the package
// indexes for pip and npm.
func (e *Executor) networkEnv() map[string]string {
	proxy := "http://" + agent.ProxyAddr
	env := map[string]string{}
	for _, k := range []string{"HTTP_PROXY", "HTTPS_PROXY", "npm_config_proxy", "npm_config_https_proxy"} {
		env[k], env[strings.ToLower(k)] = proxy, proxy
	}
	env["NO_PROXY"], env["no_proxy"] = "localhost,127.0.0.1,::1", "localhost,127.0.0.1,::1"
	if eg := e.cfg.Egress; eg != nil {
		env["PIP_INDEX_URL"] = eg.PipIndexURL
		// An index the operator serves over plain HTTP is the operator's
		// choice: pip would otherwise ignore it.
		if u, err := url.Parse(eg.PipIndexURL); err == nil && u.Scheme == "http" {
			env["PIP_TRUSTED_HOST"] = u.Hostname()
		}
		env["NPM_CONFIG_REGISTRY"] = eg.NPMRegistry
	}
	return env
}

// programEnv is the environment of the run's program: its own variables
// over the network's and its secrets' placeholders, when it asked for
// network or secrets.
func (e *Executor) programEnv(spec runbox.Spec) map[string]string {
	if !wantsNetwork(spec) {
		return spec.Env
	}
	env := e.networkEnv()
	for _, name := range spec.Secrets {
		s := egress.Secret{Name: name}
		env[s.EnvName()] = s.Placeholder()
	}
	maps.Copy(env, spec.Env)
	return env
}

// programTrust is the certificate a run's sandbox trusts for its
// program, besides its own roots: the proxy's CA, for a run with secrets.
func (e *Executor) programTrust(spec runbox.Spec) string {
	if len(spec.Secrets) == 0 || e.cfg.Egress == nil {
		return ""
	}
	return e.cfg.Egress.Proxy.TrustPEM()
}

// installOutput bounds what an install's output keeps: its tail, for the
// error.
const installOutput = 64 << 10

// installError bounds the installer's message in a run's error.
const installError = 2000

// install installs the run's packages into its conversation with a
// program of the run's language, in the sandbox the run will use. It
// returns how that program ended and, if the install failed, the run's
// error: pip's or npm's own words.
func (e *Executor) install(ctx context.Context, id string, spec runbox.Spec, dir string) (sandbox.Outcome, string, error) {
	code, env, ok := packages.Program(spec.Language, spec.Packages)
	if !ok {
		return sandbox.Outcome{}, "packages cannot be installed for " + spec.Language, nil
	}
	maps.Copy(env, e.networkEnv())
	var out tail
	oc, err := e.sandboxes.Run(ctx, sandbox.Request{RunID: id, ConversationID: spec.ConversationID, Language: spec.Language,
		Code: code, Env: env, Timeout: spec.Timeout(), DataDir: dir}, func(_ sandbox.Stream, p []byte) { out.write(p) })
	switch {
	case err != nil && ctx.Err() == nil:
		return oc, "the sandbox failed while installing packages", err
	case oc.Cancelled || ctx.Err() != nil:
		oc.Cancelled = true
		return oc, "", nil
	case oc.TimedOut:
		return oc, fmt.Sprintf("installing packages took longer than %ds and was stopped", spec.TimeoutSeconds), nil
	case oc.ExitCode != 0 || oc.OOMKilled:
		return oc, "installing packages failed: " + out.last(installError), nil
	}
	return oc, "", nil
}

// tail keeps the last installOutput bytes written to it.
type tail struct {
	mu  sync.Mutex
	buf []byte
}

func (t *tail) write(p []byte) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > installOutput {
		t.buf = t.buf[len(t.buf)-installOutput:]
	}
}

// last returns about the last n bytes, from a line's start where it can.
func (t *tail) last(n int) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := strings.TrimSpace(string(t.buf))
	if len(s) > n {
		s = s[len(s)-n:]
		if i := strings.IndexByte(s, '\n'); i >= 0 && i < len(s)-1 {
			s = s[i+1:]
		}
		s = strings.ToValidUTF8(s, "")
	}
	if s == "" {
		return "the installer said nothing"
	}
	return s
}
