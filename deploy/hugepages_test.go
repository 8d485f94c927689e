package deploy_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestHugepages runs deploy/hugepages.sh on copies of the host's THP
// settings: it turns on what gVisor's huge pages need where the kernel's
// defaults keep them off, and leaves every other choice alone.
func TestHugepages(t *testing.T) {
	const (
		shmemOpts  = "always within_size advise never deny force"
		defragOpts = "always defer defer+madvise madvise never"
	)
	// sysfs shows a setting's choices with the selected one in brackets;
	// a write of one choice selects it (here: the file holds it alone).
	show := func(opts, selected string) string {
		return strings.Replace(opts, selected, "["+selected+"]", 1) + "\n"
	}
	tests := []struct {
		shmem, defrag         string
		wantShmem, wantDefrag string // "" if left as it was
	}{
		{"never", "madvise", "advise", "defer"},
		{"never", "defer+madvise", "advise", "defer"},
		{"never", "always", "advise", ""},
		{"never", "never", "advise", ""},
		{"advise", "madvise", "", "defer"},
		{"advise", "defer", "", ""},
		{"within_size", "madvise", "", ""},
		{"always", "madvise", "", ""},
		{"force", "madvise", "", ""},
		{"deny", "madvise", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.shmem+","+tt.defrag, func(t *testing.T) {
			dir := t.TempDir()
			files := map[string]string{
				"shmem_enabled": show(shmemOpts, tt.shmem),
				"defrag":        show(defragOpts, tt.defrag),
			}
			for name, content := range files {
				if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			cmd := exec.Command("sh", "hugepages.sh")
			cmd.Env = append(os.Environ(), "THP_DIR="+dir)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("hugepages.sh: %v\n%s", err, out)
			}
			for name, want := range map[string]string{"shmem_enabled": tt.wantShmem, "defrag": tt.wantDefrag} {
				if want == "" {
					want = files[name]
				} else {
					want += "\n"
				}
				got, err := os.ReadFile(filepath.Join(dir, name))
				if err != nil {
					t.Fatal(err)
				}
				if string(got) != want {
					t.Errorf("%s = %q, want %q", name, got, want)
				}
			}
		})
	}
}
