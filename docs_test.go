package runbox

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// The documentation is read on GitHub and in an editor, and its pages link
// to each other's sections. These tests keep those links from rotting as
// sections move between pages.

var (
	// mdLink is an inline link or image, [text](target "title"), once code
	// spans are gone from the line.
	mdLink = regexp.MustCompile(`\[[^\]]*\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	// codeSpan is an inline code span: what it holds is not markdown.
	codeSpan = regexp.MustCompile("(`+)[^`]*?(`+)")
	// urlScheme marks a target outside the repository (https:, mailto:).
	urlScheme = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*:`)
	// htmlAnchor is an anchor written by hand.
	htmlAnchor = regexp.MustCompile(`<a\s+(?:id|name)="([^"]+)"`)
)

// docPages are the pages whose links are checked: the README, SECURITY.md
// and every page of docs/.
func docPages(t *testing.T) []string {
	t.Helper()
	pages, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	return append([]string{"README.md", "SECURITY.md"}, pages...)
}

// mdPage is what the link check needs of a page: its anchors and its links.
type mdPage struct {
	anchors map[string]bool
	links   []mdRef
}

type mdRef struct {
	line   int
	target string
}

// readPage reads a markdown file's headings and links, skipping fenced code
// blocks (a "# comment" in a shell block is no heading).
func readPage(path string) (mdPage, error) {
	f, err := os.Open(path)
	if err != nil {
		return mdPage{}, err
	}
	defer f.Close()
	page := mdPage{anchors: map[string]bool{}}
	seen := map[string]int{}
	fence := ""
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		trimmed := strings.TrimLeft(line, " ")
		if fence != "" {
			if strings.HasPrefix(trimmed, fence) {
				fence = ""
			}
			continue
		}
		if strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~") {
			fence = trimmed[:3]
			continue
		}
		if text, ok := headingText(line); ok {
			slug := slugify(text)
			// GitHub numbers a repeated heading's anchor: x, x-1, x-2.
			if k := seen[slug]; k > 0 {
				page.anchors[fmt.Sprintf("%s-%d", slug, k)] = true
			} else {
				page.anchors[slug] = true
			}
			seen[slug]++
		}
		for _, m := range htmlAnchor.FindAllStringSubmatch(line, -1) {
			page.anchors[m[1]] = true
		}
		for _, m := range mdLink.FindAllStringSubmatch(codeSpan.ReplaceAllString(line, ""), -1) {
			page.links = append(page.links, mdRef{line: n, target: m[1]})
		}
	}
	return page, sc.Err()
}

// headingText returns the text of an ATX heading ("## Text").
func headingText(line string) (string, bool) {
	level := len(line) - len(strings.TrimLeft(line, "#"))
	if level == 0 || level > 6 || len(line) == level || line[level] != ' ' {
		return "", false
	}
	return strings.TrimSpace(strings.TrimRight(strings.TrimSpace(line[level:]), "#")), true
}

// slugify makes a heading's anchor as GitHub does: lower case, every
// character but letters, digits, '_', '-' and spaces dropped, spaces made '-'.
func slugify(text string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(text) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.Is(unicode.Mn, r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// TestDocLinks checks that every relative link of the documentation names a
// file that exists and, where it names a section, a heading of that page.
func TestDocLinks(t *testing.T) {
	pages := map[string]mdPage{}
	read := func(path string) (mdPage, error) {
		path = filepath.Clean(path)
		if p, ok := pages[path]; ok {
			return p, nil
		}
		p, err := readPage(path)
		if err == nil {
			pages[path] = p
		}
		return p, err
	}
	for _, path := range docPages(t) {
		page, err := read(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range page.links {
			if urlScheme.MatchString(l.target) {
				continue
			}
			file, anchor, _ := strings.Cut(l.target, "#")
			target := path
			if file != "" {
				target = filepath.Join(filepath.Dir(path), file)
				if _, err := os.Stat(target); err != nil {
					t.Errorf("%s:%d: %s: no such file", path, l.line, l.target)
					continue
				}
			}
			if anchor == "" {
				continue
			}
			if !strings.HasSuffix(target, ".md") {
				t.Errorf("%s:%d: %s: a section of a file that is not markdown", path, l.line, l.target)
				continue
			}
			linked, err := read(target)
			if err != nil {
				t.Errorf("%s:%d: %s: %v", path, l.line, l.target, err)
				continue
			}
			if !linked.anchors[anchor] {
				t.Errorf("%s:%d: %s: %s has no section #%s", path, l.line, l.target, target, anchor)
			}
		}
	}
}

// TestReadmeStartsWithTheCommands holds the README to its promise to a
// newcomer: the two commands that run and test runbox come first.
func TestReadmeStartsWithTheCommands(t *testing.T) {
	f, err := os.Open("README.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	want := map[string]bool{"make run": false, "make test": false}
	sc := bufio.NewScanner(f)
	for n := 0; n < 40 && sc.Scan(); n++ {
		for cmd := range want {
			if strings.HasPrefix(strings.TrimSpace(sc.Text()), cmd) {
				want[cmd] = true
			}
		}
	}
	for cmd, found := range want {
		if !found {
			t.Errorf("README.md: %q is not in its first 40 lines", cmd)
		}
	}
}

func TestSlugify(t *testing.T) {
	tests := []struct{ heading, want string }{
		{"Using it", "using-it"},
		{"Clients, tiers, audit", "clients-tiers-audit"},
		{"gVisor: a second wall (`SANDBOX_RUNTIME=runsc`)", "gvisor-a-second-wall-sandbox_runtimerunsc"},
		{"9. Cold paths at the machine's limit: where the CPU goes", "9-cold-paths-at-the-machines-limit-where-the-cpu-goes"},
		{"What is contained, and how", "what-is-contained-and-how"},
		{"Runs — and files", "runs--and-files"},
	}
	for _, tt := range tests {
		if got := slugify(tt.heading); got != tt.want {
			t.Errorf("slugify(%q) = %q, want %q", tt.heading, got, tt.want)
		}
	}
}
