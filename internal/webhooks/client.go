package webhooks

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/runbox-dev/runbox/internal/egress"
)

// AttemptTimeout is the default bound of one attempt to deliver a
// webhook (Options.AttemptTimeout): connecting, sending, and the
// receiver's answer.
const AttemptTimeout = 10 * time.Second

// maxResponseHeader bounds the head of a receiver's answer.
const maxResponseHeader = 16 << 10

// newHTTPClient returns the client webhooks are posted with. It connects
// only to addresses the policy checked for the request's host, dialling
// each address itself (no second resolution a rebinding name could
// change), goes through no proxy of the environment, follows no
// redirect, and gives each attempt timeout. TLS checks the
// certificate against the host's name (roots: the system's, or rootCAs
// when set, for tests).
func newHTTPClient(p *Policy, rootCAs *x509.CertPool, timeout time.Duration) *http.Client {
	dialer := &net.Dialer{Timeout: timeout}
	tr := &http.Transport{
		Proxy: nil,
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			host, ps, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, err
			}
			port, err := strconv.ParseUint(ps, 10, 16)
			if err != nil {
				return nil, err
			}
			t := Target{Host: egress.NormalizeHost(host), Port: uint16(port)}
			if m, mapped := p.Hosts[t.Host]; mapped && !m.Allows(t.Port) || !mapped && t.Port != 443 {
				return nil, refused("port %d is not one callbacks to %s may use", t.Port, t.Host)
			}
			addrs, err := p.Resolve(ctx, t)
			if err != nil {
				return nil, err
			}
			var last error
			for _, a := range addrs {
				c, err := dialer.DialContext(ctx, "tcp", a.String())
				if err == nil {
					return c, nil
				}
				last = err
			}
			return nil, last
		},
		TLSHandshakeTimeout:    timeout,
		ResponseHeaderTimeout:  timeout,
		MaxResponseHeaderBytes: maxResponseHeader,
		DisableCompression:     true,
		MaxIdleConnsPerHost:    4,
		IdleConnTimeout:        30 * time.Second,
	}
	tr.TLSClientConfig = &tls.Config{RootCAs: rootCAs, MinVersion: tls.VersionTLS12}
	return &http.Client{
		Transport: tr,
		Timeout:   timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
}
