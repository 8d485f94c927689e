package preview

import (
	"fmt"
	"net"
	"strings"
)

// Domain is where previews are served: each at <capability>.<domain>, the
// root of an origin of its own, never the api's.
type Domain struct {
	scheme string // http or https
	host   string // lower case, no port: "localhost", "preview.example.com"
	port   string // in URLs; "" for the scheme's default
}

// ParseDomain reads PREVIEW_BASE_DOMAIN ("preview.example.com",
// "localhost:8080"); URLs use scheme.
func ParseDomain(domain, scheme string) (Domain, error) {
	host, port := domain, ""
	if h, p, err := net.SplitHostPort(domain); err == nil {
		host, port = h, p
	}
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	if scheme != "http" && scheme != "https" {
		return Domain{}, fmt.Errorf("scheme %q is not http or https", scheme)
	}
	if !validHostName(host) || net.ParseIP(host) != nil {
		return Domain{}, fmt.Errorf("%q is not a host name previews can be served under", domain)
	}
	if (scheme == "http" && port == "80") || (scheme == "https" && port == "443") {
		port = ""
	}
	return Domain{scheme: scheme, host: host, port: port}, nil
}

// validHostName reports whether h is a DNS name of letters, digits and
// hyphens whose whole, with a capability before it, fits the 253 bytes
// of a name.
func validHostName(h string) bool {
	if h == "" || len(h)+LabelLen+1 > 253 {
		return false
	}
	for label := range strings.SplitSeq(h, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, r := range label {
			if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') {
				return false
			}
		}
	}
	return true
}

// String is the domain as configured.
func (d Domain) String() string {
	if d.port == "" {
		return d.host
	}
	return net.JoinHostPort(d.host, d.port)
}

// URL returns the preview URL of a capability.
func (d Domain) URL(label string) string {
	host := label + "." + d.host
	if d.port != "" {
		host = net.JoinHostPort(host, d.port)
	}
	return d.scheme + "://" + host + "/"
}

// Match tells whether a request's Host names a preview: any name under the
// domain is a preview host (and so never served by the api), whatever its
// port; label is its first label when it has exactly one more than the
// domain, else "".
func (d Domain) Match(hostHeader string) (label string, preview bool) {
	host := hostHeader
	if h, _, err := net.SplitHostPort(hostHeader); err == nil {
		host = h
	}
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	rest, ok := strings.CutSuffix(host, "."+d.host)
	if !ok || rest == "" {
		return "", false
	}
	if strings.Contains(rest, ".") {
		return "", true
	}
	return rest, true
}

// Under reports whether host (a URL's host, maybe with a port) is a name
// under the domain: a preview host, where the api must never be. (The
// domain itself may be the api's: previews are other origins still.)
func (d Domain) Under(host string) bool {
	_, preview := d.Match(host)
	return preview
}
