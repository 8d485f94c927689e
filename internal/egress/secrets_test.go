package egress

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"html"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/iotest"
)

func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLoadSecrets(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "openai.key", "sk-from-a-file-0123\n")
	path := writeFile(t, dir, "secrets.yaml", `secrets:
  openai:
    value_file: openai.key
    domains: [api.openai.com]
  anthropic:
    value: sk-ant-0123456789
    domains: ["*.anthropic.com", api.anthropic.com]
    header: x-api-key
  GitHub_Token:
    value: ghp_0123456789
    domains: [api.github.com]
    header: Authorization
    format: "token {value}"
`)
	ss, err := LoadSecrets(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(ss.Names(), ","); got != "GitHub_Token,anthropic,openai" {
		t.Fatalf("names %s", got)
	}
	for name, want := range map[string]Secret{
		"openai":       {Value: "sk-from-a-file-0123", Header: "Authorization", Format: "Bearer {value}"},
		"anthropic":    {Value: "sk-ant-0123456789", Header: "X-Api-Key", Format: "{value}"},
		"GitHub_Token": {Value: "ghp_0123456789", Header: "Authorization", Format: "token {value}"},
	} {
		s := ss[name]
		if s.Value != want.Value || s.Header != want.Header || s.Format != want.Format {
			t.Errorf("%s: %+v", name, s)
		}
	}
	if env := ss["GitHub_Token"].EnvName(); env != "GITHUB_TOKEN" {
		t.Errorf("env %s", env)
	}
	if !ss["anthropic"].For("api.anthropic.com") || !ss["anthropic"].For("x.anthropic.com") || ss["anthropic"].For("anthropic.com") {
		t.Error("anthropic's domains")
	}
	if d := ss.Domains().Strings(); strings.Join(d, ",") != "api.github.com,*.anthropic.com,api.anthropic.com,api.openai.com" {
		t.Errorf("domains %v", d)
	}
}

func TestLoadSecretsRefuses(t *testing.T) {
	const value = "the-value-0123456789"
	for _, tt := range []struct{ name, yaml, want string }{
		{"no value", "secrets: {a: {domains: [x.com]}}", "exactly one of value and value_file"},
		{"both values", "secrets: {a: {value: " + value + ", value_file: f, domains: [x.com]}}", "exactly one of"},
		{"a missing file", "secrets: {a: {value_file: nowhere, domains: [x.com]}}", "value_file"},
		{"no domain", "secrets: {a: {value: " + value + "}}", "domains names none"},
		{"a bad domain", "secrets: {a: {value: " + value + ", domains: [\"1.2.3.4\"]}}", "domains"},
		{"a bad name", "secrets: {open-ai: {value: " + value + ", domains: [x.com]}}", "secret name"},
		{"names that clash", "secrets: {ab: {value: " + value + ", domains: [x.com]}, AB: {value: " + value + ", domains: [x.com]}}", "also secret"},
		{"a variable the sandbox sets", "secrets: {https_proxy: {value: " + value + ", domains: [x.com]}}", "one the sandbox sets"},
		{"runbox's variables", "secrets: {runbox_x: {value: " + value + ", domains: [x.com]}}", "one the sandbox sets"},
		{"a short value", "secrets: {a: {value: short, domains: [x.com]}}", "8 to"},
		{"a value with a newline", "secrets: {a: {value: \"" + value + "\\r\\nX-Evil: 1\", domains: [x.com]}}", "control character"},
		{"a format without the value", "secrets: {a: {value: " + value + ", domains: [x.com], format: Bearer}}", "must hold {value}"},
		{"a framing header", "secrets: {a: {value: " + value + ", domains: [x.com], header: Host}}", "frames the request"},
		{"a bad header", "secrets: {a: {value: " + value + ", domains: [x.com], header: \"a b\"}}", "not a header name"},
		{"an unknown field", "secrets: {a: {value: " + value + ", domains: [x.com], domain: y.com}}", "not the YAML"},
		{"a value inside the placeholder", "secrets: {a: {value: secret-a-placeholder, domains: [x.com]}}", "hold each other"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := LoadSecrets(writeFile(t, t.TempDir(), "s.yaml", tt.yaml))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("%v, want %q", err, tt.want)
			}
			if strings.Contains(err.Error(), value) {
				t.Errorf("the error holds the value: %v", err)
			}
		})
	}
}

func TestApplySecrets(t *testing.T) {
	svc := Secret{Name: "svc", Value: "value-of-svc", Header: "Authorization", Format: "Bearer {value}"}
	key := Secret{Name: "key", Value: "value-of-key", Header: "X-Key", Format: "{value}"}
	h := http.Header{
		"Authorization": {"Basic forged"},
		"X-Key":         {"whatever"},
		"Cookie":        {"a=" + svc.Placeholder() + "; b=" + key.Placeholder()},
		"X-Other":       {Placeholder("other")},
	}
	applySecrets(h, []Secret{svc, key})
	want := http.Header{
		"Authorization": {"Bearer value-of-svc"},
		"X-Key":         {"value-of-key"},
		"Cookie":        {"a=value-of-svc; b=value-of-key"},
		"X-Other":       {Placeholder("other")},
	}
	for k, v := range want {
		if strings.Join(h[k], "|") != strings.Join(v, "|") {
			t.Errorf("%s: %q, want %q", k, h[k], v)
		}
	}
	newRedaction([]Secret{svc, key}).header(h)
	if c := h.Get("Cookie"); c != "a="+svc.Placeholder()+"; b="+key.Placeholder() {
		t.Errorf("scrubbed %q", c)
	}
}

// scrubRef is what scrubbing must give: each form replaced, leftmost
// first, the longest of those starting at the same place.
func scrubRef(in []byte, rd *redaction) []byte {
	var out []byte
	for i := 0; i < len(in); {
		best := -1
		for k, p := range rd.pairs {
			if bytes.HasPrefix(in[i:], p.form) && (best < 0 || len(p.form) > len(rd.pairs[best].form)) {
				best = k
			}
		}
		if best < 0 {
			out = append(out, in[i])
			i++
			continue
		}
		out = append(out, rd.pairs[best].placeholder...)
		i += len(rd.pairs[best].form)
	}
	return out
}

func scrubAll(t testing.TB, in []byte, rd *redaction, oneByte bool) []byte {
	var r io.Reader = bytes.NewReader(in)
	if oneByte {
		r = iotest.OneByteReader(r)
	}
	closed := false
	s := newScrubber(io.NopCloser(r), rd, func() { closed = true })
	out, err := io.ReadAll(s)
	if err != nil || s.Close() != nil || !closed {
		t.Fatalf("%v, closed %v", err, closed)
	}
	return out
}

func TestScrubber(t *testing.T) {
	rd := newRedaction([]Secret{{Name: "a", Value: "sk-abcdef12"}, {Name: "b", Value: "sk-abcdef1234"}})
	for _, in := range []string{
		"", "nothing here", "sk-abcdef12", "x sk-abcdef12 y sk-abcdef1234 z", "sk-abcdef1sk-abcdef12", "sk-abc",
		"sk-abcdef12sk-abcdef12", "ends with a start sk-abcdef1", strings.Repeat("sk-", 20000) + "sk-abcdef12",
	} {
		for _, oneByte := range []bool{false, true} {
			got := scrubAll(t, []byte(in), rd, oneByte)
			if want := scrubRef([]byte(in), rd); !bytes.Equal(got, want) {
				t.Errorf("%.60q (one byte %v): %.80q, want %.80q", in, oneByte, got, want)
			}
		}
	}
}

func TestScrubberReleasesWhatCannotBeAValue(t *testing.T) {
	ss := []Secret{{Name: "a", Value: "sk-abcdef12"}}
	pr, pw := io.Pipe()
	s := newScrubber(pr, newRedaction(ss), nil)
	go pw.Write([]byte("data: hello\n\nsk-ab"))
	buf := make([]byte, 100)
	n, err := s.Read(buf)
	if err != nil || string(buf[:n]) != "data: hello\n\n" {
		t.Fatalf("%q %v", buf[:n], err)
	}
	go func() { pw.Write([]byte("cdef12!")); pw.Close() }()
	rest, _ := io.ReadAll(s)
	if string(rest) != ss[0].Placeholder()+"!" {
		t.Errorf("%q", rest)
	}
}

func FuzzScrubber(f *testing.F) {
	f.Add([]byte("x sk-abcdef12 y"), "sk-abcdef12", "sk-abcdef1234")
	f.Add([]byte("aaaaaaaaaaaaaaaaaaaa"), "aaaaaaaa", "aaaaaaaab")
	f.Fuzz(func(t *testing.T, in []byte, v1, v2 string) {
		if len(v1) < MinSecretBytes || len(v2) < MinSecretBytes || v1 == v2 {
			return
		}
		rd := newRedaction([]Secret{{Name: "a", Value: v1}, {Name: "b", Value: v2}})
		for _, oneByte := range []bool{false, true} {
			if got, want := scrubAll(t, in, rd, oneByte), scrubRef(in, rd); !bytes.Equal(got, want) {
				t.Fatalf("one byte %v: %q, want %q", oneByte, got, want)
			}
		}
	})
}

func TestScrubberForms(t *testing.T) {
	// A server echoes the header in the encodings servers write text in;
	// what the program reads holds none of the value, whatever the
	// reads.
	const v = `tok/en+"<a&b>" x=1%`
	svc := Secret{Name: "svc", Value: v}
	rd := newRedaction([]Secret{svc})
	header := "Bearer " + v
	goJSON, _ := json.Marshal(header)
	var plain bytes.Buffer
	enc := json.NewEncoder(&plain)
	enc.SetEscapeHTML(false)
	enc.Encode(header)
	unJSON := func(s string) string { var out string; json.Unmarshal([]byte(s), &out); return out }
	for _, tt := range []struct {
		name, echo string
		decode     func(string) string // what the program would do with what it reads
	}{
		{"literal", header, func(s string) string { return s }},
		{"JSON", string(goJSON), unJSON},
		{"JSON, HTML as is", plain.String(), unJSON},
		{"JSON, '/' too", strings.ReplaceAll(string(goJSON), "/", `\/`), unJSON},
		{"HTML", html.EscapeString(header), html.UnescapeString},
		{"a query", url.Values{"auth": {header}}.Encode(), func(s string) string { q, _ := url.ParseQuery(s); return q.Get("auth") }},
		{"a path", url.PathEscape(header), func(s string) string { p, _ := url.PathUnescape(s); return p }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if tt.decode(tt.echo) != header {
				t.Fatalf("the echo %q does not decode", tt.echo)
			}
			for _, oneByte := range []bool{false, true} {
				if got := tt.decode(string(scrubAll(t, []byte(tt.echo), rd, oneByte))); got != "Bearer "+svc.Placeholder() {
					t.Errorf("%q gives %q", tt.echo, got)
				}
			}
		})
	}
	for _, b64 := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
		for _, prefix := range []string{"", "B", "Bearer ", "Basic x:"} {
			echo := b64.EncodeToString([]byte(prefix + v + "!"))
			got := string(scrubAll(t, []byte(echo), rd, false))
			if !strings.Contains(got, svc.Placeholder()) {
				t.Errorf("base64 of %q: %q gives %q", prefix+v, echo, got)
				continue
			}
			// What is left decodes to at most two bytes of the value at
			// either end.
			before, after, _ := strings.Cut(got, svc.Placeholder())
			for _, part := range []string{before, after} {
				if len(part) > len(b64.EncodeToString([]byte(prefix+"!!!"))) {
					t.Errorf("base64 of %q: %q left around the placeholder", prefix+v, part)
				}
			}
		}
	}
}

// BenchmarkScrubber measures scrubbing a body of text that holds no
// value, with two secrets (each in all its forms).
func BenchmarkScrubber(b *testing.B) {
	rd := newRedaction([]Secret{{Name: "a", Value: testValue}, {Name: "b", Value: testKeyValue}})
	body := bytes.Repeat([]byte(`{"id": "chatcmpl-0123456789", "object": "chat.completion", "content": "sk-live is a prefix"}`+"\n"), 10000)
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		io.Copy(io.Discard, newScrubber(io.NopCloser(bytes.NewReader(body)), rd, nil))
	}
}
