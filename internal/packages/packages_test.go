package packages

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestInstalled(t *testing.T) {
	dir := t.TempDir()
	mk := func(p, content string) {
		t.Helper()
		full := filepath.Join(dir, ".packages", p)
		os.MkdirAll(filepath.Dir(full), 0o755)
		if content != "" {
			os.WriteFile(full, []byte(content), 0o644)
		} else {
			os.MkdirAll(full, 0o755)
		}
	}
	mk("python/lib/python3.11/site-packages/tinypkg-0.1.0.dist-info", "")
	mk("python/lib/python3.11/site-packages/Other_Name-2.0.1.dist-info", "")
	mk("python/lib/python3.11/site-packages/tinypkg/__init__.py", "X = 1")
	mk("node/node_modules/tiny/package.json", `{"name": "tiny", "version": "1.0.0"}`)
	mk("node/node_modules/@scope/pkg/package.json", `{"name": "@scope/pkg", "version": "2.1.0"}`)
	mk("node/node_modules/.package-lock.json", `{}`)
	mk("node/node_modules/broken/package.json", `{`)
	// A program's link out of the folder is not followed.
	os.Symlink("/etc", filepath.Join(dir, ".packages/node/node_modules/escape"))
	os.MkdirAll(filepath.Join(dir, ".packages/node/node_modules/escape2"), 0o755)
	os.Symlink("/etc/hostname", filepath.Join(dir, ".packages/node/node_modules/escape2/package.json"))

	for lang, want := range map[string][]string{
		"python":     {"Other_Name==2.0.1", "tinypkg==0.1.0"},
		"typescript": {"@scope/pkg@2.1.0", "tiny@1.0.0"},
		"bash":       nil,
	} {
		got, err := Installed(dir, lang)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("%s: %v, %v; want %v", lang, got, err, want)
		}
	}
	if got, err := Installed(t.TempDir(), "python"); err != nil || len(got) != 0 {
		t.Errorf("nothing installed: %v, %v", got, err)
	}
}

func TestProgram(t *testing.T) {
	for _, lang := range []string{"python", "typescript"} {
		code, env, ok := Program(lang, []string{"a==1", `b"; rm -rf /`})
		var pkgs []string
		if !ok || json.Unmarshal([]byte(env[Env]), &pkgs) != nil || len(pkgs) != 2 || strings.Contains(code, "rm -rf") {
			t.Errorf("%s: %q %v %v", lang, code, env, ok)
		}
	}
	if _, _, ok := Program("bash", []string{"x"}); ok {
		t.Error("bash installs packages")
	}
}
