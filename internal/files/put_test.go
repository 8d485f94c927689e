package files

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/runbox-dev/runbox"
)

func TestPut(t *testing.T) {
	f, dir := newFolders(t)
	outside := t.TempDir()
	os.Symlink(outside, filepath.Join(dir, "out"))
	os.WriteFile(filepath.Join(dir, "plain"), []byte("x"), 0o644)

	if err := f.Put("conv1", []PutFile{
		{Name: "index.html", Data: []byte("<p>hi</p>")},
		{Name: "src/components/App.jsx", Data: []byte("export default 1")},
		{Name: "/data/src/main.jsx", Data: []byte("main")},
	}); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"index.html": "<p>hi</p>", "src/components/App.jsx": "export default 1", "src/main.jsx": "main"} {
		if b, err := os.ReadFile(filepath.Join(dir, name)); err != nil || string(b) != want {
			t.Errorf("%s: %q %v", name, b, err)
		}
	}
	// Replacing a file leaves nothing of the old one, nor a temporary file.
	if err := f.Put("conv1", []PutFile{{Name: "src/main.jsx", Data: []byte("v2")}}); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(filepath.Join(dir, "src"))
	if len(entries) != 2 {
		t.Errorf("src holds %v", entries)
	}

	for _, tc := range []struct {
		name, code string
	}{
		{"../escape.txt", runbox.EInvalidPath},
		{"/etc/passwd", runbox.EInvalidPath},
		{"out/planted.txt", runbox.EInvalidPath}, // through a link out of the folder
		{"plain/child.txt", runbox.EInvalidPath}, // under a file
		{"src", runbox.EInvalidPath},             // a folder
		{"a//b", runbox.EInvalidPath},
	} {
		err := f.Put("conv1", []PutFile{{Name: tc.name, Data: []byte("x")}})
		if runbox.ErrorCode(err) != tc.code {
			t.Errorf("%s: %v, want %s", tc.name, err, tc.code)
		}
	}
	if entries, _ := os.ReadDir(outside); len(entries) != 0 {
		t.Errorf("a file landed outside the folder: %v", entries)
	}

	// Over the quota (8 MiB): nothing is written.
	err := f.Put("conv1", []PutFile{{Name: "small.txt", Data: []byte("s")}, {Name: "big.bin", Data: []byte(strings.Repeat("x", 9<<20))}})
	if runbox.ErrorCode(err) != runbox.EQuotaExceeded {
		t.Fatalf("over the quota: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "small.txt")); err == nil {
		t.Error("a refused Put wrote part of its files")
	}
}
