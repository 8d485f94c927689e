package egress

import (
	"bufio"
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// A request's head, read before net/http parses it, and the target it
// asks for.

var errHeadTooLarge = errors.New("the request's head is too large")

// readHead waits for a request's whole head in br, without consuming it,
// and returns its request line and the values of its Host headers:
// net/http drops the header of a request in absolute form.
func readHead(br *bufio.Reader) (string, []string, error) {
	if _, err := br.Peek(1); err != nil {
		return "", nil, err
	}
	for {
		buf, _ := br.Peek(br.Buffered())
		if end := headEnd(buf); end >= 0 {
			return parseHead(buf[:end])
		}
		if br.Buffered() >= maxHead {
			line, _, _ := bytes.Cut(buf, []byte("\n"))
			return string(line), nil, errHeadTooLarge
		}
		if _, err := br.Peek(br.Buffered() + 1); err != nil {
			return "", nil, err
		}
	}
}

// lineHost returns the host a request line names, as far as it can be
// told, for the record of a request refused before it was parsed.
func lineHost(line string) string {
	fields := strings.Fields(line)
	if len(fields) < 2 {
		return ""
	}
	if u, err := url.Parse(fields[1]); err == nil && u.Host != "" {
		return cut(u.Hostname())
	}
	if h, _, err := net.SplitHostPort(fields[1]); err == nil {
		return cut(h)
	}
	return ""
}

// headEnd returns where the blank line ending a head starts, or -1.
func headEnd(b []byte) int {
	end := -1
	for _, sep := range [][]byte{[]byte("\n\r\n"), []byte("\n\n")} {
		if i := bytes.Index(b, sep); i >= 0 && (end < 0 || i < end) {
			end = i
		}
	}
	return end
}

var errFolded = errors.New("a folded header line")

func parseHead(head []byte) (string, []string, error) {
	var hosts []string
	lines := strings.Split(string(head), "\n")
	first := strings.TrimSuffix(lines[0], "\r")
	for _, line := range lines[1:] {
		line = strings.TrimSuffix(line, "\r")
		if line != "" && (line[0] == ' ' || line[0] == '\t') {
			return first, nil, errFolded
		}
		if name, value, ok := strings.Cut(line, ":"); ok && strings.EqualFold(name, "host") {
			hosts = append(hosts, strings.TrimSpace(value))
		}
	}
	return first, hosts, nil
}

// requestTarget returns what a request asks for, the host as it was
// written (for the record), and why it is refused, if it is.
func requestTarget(req *http.Request, hosts []string) (target, string, string) {
	var host, port string
	defPort := "80"
	switch {
	case req.ProtoMajor != 1:
		return target{}, "", "only HTTP/1.x is proxied"
	case req.Method == http.MethodConnect:
		var err error
		if host, port, err = net.SplitHostPort(req.RequestURI); err != nil {
			return target{}, cut(req.RequestURI), "CONNECT names host:port"
		}
		defPort = port
	case req.URL.Host == "":
		return target{}, "", "requests through the proxy name their target in full (http://host/…)"
	case req.URL.Scheme != "http":
		return target{}, cut(req.URL.Host), "only http:// requests are forwarded; https goes through CONNECT"
	default:
		host, port = req.URL.Hostname(), cmp.Or(req.URL.Port(), "80")
	}
	n, err := strconv.ParseUint(port, 10, 16)
	t := target{host: NormalizeHost(host), port: uint16(n)}
	raw := cut(host)
	switch {
	case t.host == "":
		return t, raw, "no host"
	case err != nil || n == 0:
		return t, raw, "a bad port"
	case len(hosts) == 1 && !sameAuthority(hosts[0], t, defPort):
		return t, raw, fmt.Sprintf("the Host header names %q, not the request's target", cut(hosts[0]))
	}
	return t, raw, ""
}

// sameAuthority reports whether a Host header names t (a header without a
// port names defPort).
func sameAuthority(h string, t target, defPort string) bool {
	host, port, err := net.SplitHostPort(h)
	if err != nil {
		host, port = h, defPort
	}
	return NormalizeHost(host) == t.host && port == strconv.Itoa(int(t.port))
}

func cut(s string) string {
	if len(s) > 255 {
		return s[:255]
	}
	return s
}
