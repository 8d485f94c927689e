package config

import (
	"cmp"
	"fmt"
	"net/url"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/docker/go-units"
)

// parser keeps the first error, so FromEnv reads as a list of settings.
type parser struct {
	getenv func(string) string
	err    error
}

func (p *parser) fail(name, msg string) {
	if p.err == nil {
		p.err = fmt.Errorf("config: %s %s", name, msg)
	}
}

func (p *parser) str(name, def string) string {
	return cmp.Or(strings.TrimSpace(p.getenv(name)), def)
}

func (p *parser) duration(name string, def time.Duration) time.Duration {
	v := p.getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		p.fail(name, fmt.Sprintf("must be a positive duration such as 30s or 24h (got %q)", v))
		return def
	}
	return d
}

// positive reads a whole number of at least 1.
func (p *parser) positive(name string, def int) int { return p.atLeast(name, def, 1) }

// nonNegative reads a whole number of at least 0.
func (p *parser) nonNegative(name string, def int) int { return p.atLeast(name, def, 0) }

func (p *parser) atLeast(name string, def, least int) int {
	v := p.getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < least {
		p.fail(name, fmt.Sprintf("must be a whole number of at least %d (got %q)", least, v))
		return def
	}
	return n
}

func (p *parser) bytes(name, def string) int64 {
	v := p.str(name, def)
	n, err := units.RAMInBytes(v)
	if err != nil || n <= 0 {
		p.fail(name, fmt.Sprintf("must be a size such as 512m or 1g (got %q)", v))
		return 0
	}
	return n
}

func (p *parser) cpus(name, def string) int64 {
	v := p.str(name, def)
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f <= 0 || f > float64(runtime.NumCPU()*4) {
		p.fail(name, fmt.Sprintf("must be a positive number of cores such as 1.0 (got %q)", v))
		return 0
	}
	return int64(f * 1e9)
}

// indexURL reads the http(s) URL of a package index.
func (p *parser) indexURL(name, def string) string {
	v := p.str(name, def)
	if u, err := url.Parse(v); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" || u.User != nil {
		p.fail(name, fmt.Sprintf("must be an http(s) URL without credentials (got %q)", v))
	}
	return v
}

func (p *parser) oneOf(name, def string, allowed ...string) string {
	v := strings.ToLower(p.str(name, def))
	for _, a := range allowed {
		if v == a {
			return v
		}
	}
	p.fail(name, fmt.Sprintf("must be one of %s (got %q)", strings.Join(allowed, ", "), v))
	return def
}
