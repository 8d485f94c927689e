package files

import (
	"cmp"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/runbox-dev/runbox"
)

func newFolders(t *testing.T) (*Folders, string) { return newFoldersIn(t, QuotaWalk) }

// newFoldersIn makes folders in mode, and conversation conv1's.
func newFoldersIn(t *testing.T, mode QuotaMode) (*Folders, string) {
	t.Helper()
	needLoop(t, mode)
	root := t.TempDir()
	t.Cleanup(func() { unmountAll(root) })
	f, err := NewFolders(root, Options{UID: os.Getuid(), GID: os.Getgid(), Quota: 8 << 20, Mode: mode})
	if err != nil {
		t.Fatal(err)
	}
	dir, err := f.Ensure("conv1")
	if err != nil {
		t.Fatal(err)
	}
	return f, dir
}

func TestOpenStaysInsideTheFolder(t *testing.T) {
	f, dir := newFolders(t)
	secret := filepath.Join(t.TempDir(), "host-secret")
	os.WriteFile(secret, []byte("host"), 0o644)
	os.WriteFile(filepath.Join(dir, "ok.csv"), []byte("a,b\n"), 0o644)
	os.Mkdir(filepath.Join(dir, "sub"), 0o755)
	os.WriteFile(filepath.Join(dir, "sub", "x.txt"), []byte("x"), 0o644)
	os.Symlink(secret, filepath.Join(dir, "abs-link"))
	os.Symlink("../../../../../../../../etc/passwd", filepath.Join(dir, "rel-link"))
	os.Symlink(filepath.Dir(secret), filepath.Join(dir, "dir-link"))
	syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o644)

	tests := []struct {
		name    string
		want    string
		wantErr string
	}{
		{"ok.csv", "a,b\n", ""},
		{"/data/ok.csv", "a,b\n", ""},
		{"sub/x.txt", "x", ""},
		{"missing", "", runbox.ENotFound},
		{"abs-link", "", runbox.ENotFound},
		{"rel-link", "", runbox.ENotFound},
		{"dir-link/host-secret", "", runbox.ENotFound},
		{"fifo", "", runbox.ENotFound},
		{"sub", "", runbox.ENotFound},
		{"../files/ok.csv", "", runbox.EInvalidPath},
		{"../../etc/passwd", "", runbox.EInvalidPath},
		{"/etc/passwd", "", runbox.EInvalidPath},
		{"sub/../ok.csv", "", runbox.EInvalidPath},
		{"a\x00b", "", runbox.EInvalidPath},
		{"", "", runbox.EInvalidPath},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			done := make(chan struct{})
			go func() {
				defer close(done)
				file, _, err := f.Open("conv1", tt.name)
				if tt.wantErr != "" {
					if runbox.ErrorCode(err) != tt.wantErr {
						t.Errorf("Open(%q) error %v, want %s", tt.name, err, tt.wantErr)
					}
					if file != nil {
						file.Close()
					}
					return
				}
				if err != nil {
					t.Errorf("Open(%q): %v", tt.name, err)
					return
				}
				defer file.Close()
				b, _ := io.ReadAll(file)
				if string(b) != tt.want {
					t.Errorf("read %q, want %q", b, tt.want)
				}
			}()
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				t.Fatal("Open blocked")
			}
		})
	}
	if _, _, err := f.Open("../conv1", "ok.csv"); runbox.ErrorCode(err) != runbox.EInvalid {
		t.Errorf("conversation id with ..: %v", err)
	}
}

func TestListSkipsLinksAndSpecialFiles(t *testing.T) {
	f, dir := newFolders(t)
	os.WriteFile(filepath.Join(dir, "b.png"), []byte("png"), 0o644)
	os.WriteFile(filepath.Join(dir, "a.csv"), []byte("csv!"), 0o644)
	os.MkdirAll(filepath.Join(dir, "out", "deep"), 0o755)
	os.WriteFile(filepath.Join(dir, "out", "deep", "c.txt"), nil, 0o644)
	os.Symlink("/etc", filepath.Join(dir, "etc"))
	os.Symlink("/etc/passwd", filepath.Join(dir, "passwd"))
	syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o644)

	entries, err := f.List("conv1")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name)
	}
	if got := strings.Join(names, " "); got != "a.csv b.png out/deep/c.txt" {
		t.Errorf("listed %q", got)
	}
	if entries[0].Size != 4 {
		t.Errorf("size %d", entries[0].Size)
	}
	if none, err := f.List("never-used"); err != nil || len(none) != 0 {
		t.Errorf("missing folder lists %v, %v", none, err)
	}
}

func TestChanged(t *testing.T) {
	t0 := time.Unix(100, 0)
	before := []Entry{{Name: "same", Size: 1, ModTime: t0}, {Name: "grown", Size: 1, ModTime: t0}, {Name: "touched", Size: 1, ModTime: t0}, {Name: "deleted", Size: 1, ModTime: t0}}
	after := []Entry{{Name: "same", Size: 1, ModTime: t0}, {Name: "grown", Size: 2, ModTime: t0}, {Name: "touched", Size: 1, ModTime: t0.Add(time.Nanosecond)}, {Name: "new", Size: 1, ModTime: t0}}
	var got []string
	for _, e := range Changed(before, after) {
		got = append(got, e.Name)
	}
	if strings.Join(got, " ") != "grown touched new" {
		t.Errorf("changed = %v", got)
	}
}

func TestSigner(t *testing.T) {
	s := NewSigner([]byte("0123456789abcdef0123456789abcdef"), "http://h:1/", time.Hour)
	u := s.URL("conv1", "out/result file.csv")
	if !strings.HasPrefix(u, "http://h:1/files/conv1/out/result%20file.csv?exp=") {
		t.Fatalf("URL %s", u)
	}
	exp, sig := query(t, u)
	tests := []struct {
		name           string
		cid, file, exp string
		sig            string
		want           bool
	}{
		{"valid", "conv1", "out/result file.csv", exp, sig, true},
		{"other file", "conv1", "out/other.csv", exp, sig, false},
		{"other conversation", "conv2", "out/result file.csv", exp, sig, false},
		{"changed digit", "conv1", "out/result file.csv", exp, flip(sig), false},
		{"extended expiry", "conv1", "out/result file.csv", exp + "0", sig, false},
		{"not hex", "conv1", "out/result file.csv", exp, "zz", false},
		{"empty", "conv1", "out/result file.csv", "", "", false},
	}
	for _, tt := range tests {
		if got := s.Verify(tt.cid, tt.file, tt.exp, tt.sig); got != tt.want {
			t.Errorf("%s: Verify = %v", tt.name, got)
		}
	}
	s.now = func() time.Time { return time.Now().Add(2 * time.Hour) }
	if s.Verify("conv1", "out/result file.csv", exp, sig) {
		t.Error("expired URL verified")
	}
}

func query(t *testing.T, u string) (exp, sig string) {
	_, q, _ := strings.Cut(u, "?")
	for kv := range strings.SplitSeq(q, "&") {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "exp":
			exp = v
		case "sig":
			sig = v
		}
	}
	if exp == "" || sig == "" {
		t.Fatalf("URL %s lacks exp or sig", u)
	}
	return exp, sig
}

func flip(hexsig string) string {
	b := []byte(hexsig)
	if b[0] == '0' {
		b[0] = '1'
	} else {
		b[0] = '0'
	}
	return string(b)
}

func TestLoadOrCreateSecret(t *testing.T) {
	file := filepath.Join(t.TempDir(), "sub", "secret")
	a, err := LoadOrCreateSecret(file)
	if err != nil || len(a) < 32 {
		t.Fatalf("secret %q, %v", a, err)
	}
	b, _ := LoadOrCreateSecret(file)
	if string(a) != string(b) {
		t.Error("secret changed across loads")
	}
	if info, _ := os.Stat(file); info.Mode().Perm() != 0o600 {
		t.Errorf("secret mode %v", info.Mode())
	}
}

func TestMimeType(t *testing.T) {
	for name, want := range map[string]string{
		"a.CSV": "text/csv; charset=utf-8", "chart.png": "image/png", "r.pdf": "application/pdf", "blob": "application/octet-stream",
	} {
		if got := MimeType(name); got != want {
			t.Errorf("MimeType(%q) = %q, want %q", name, got, want)
		}
	}
}

func FuzzConversationID(f *testing.F) {
	for _, s := range []string{"conv1", "..", "a/b", "a b", "", strings.Repeat("x", 65), "sess_0123456789ab"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		if !runbox.ValidConversationID(id) {
			return
		}
		if !filepath.IsLocal(id) || strings.ContainsAny(id, "/\\.\x00") || len(id) > 64 {
			t.Fatalf("ValidConversationID accepted %q", id)
		}
	})
}

// needLoop skips a loop-mode test where it cannot run: mounting needs root.
func needLoop(t *testing.T, mode QuotaMode) {
	if mode == QuotaLoop && os.Geteuid() != 0 {
		t.Skip("loop-mounted quotas need root")
	}
}

func TestWrite(t *testing.T) {
	for _, mode := range []QuotaMode{QuotaWalk, QuotaLoop} {
		t.Run(string(mode), func(t *testing.T) {
			needLoop(t, mode)
			root := t.TempDir()
			t.Cleanup(func() { unmountAll(root) })
			f, err := NewFolders(root, Options{UID: 1000, GID: 1000, Quota: 4 << 20, Mode: mode})
			if err != nil {
				t.Fatal(err)
			}
			if f.HardQuota() != (mode == QuotaLoop) {
				t.Errorf("HardQuota = %v", f.HardQuota())
			}
			write := func(name string, n int, overwrite bool) error {
				_, err := f.Write("c1", name, strings.NewReader(strings.Repeat("x", n)), 3<<20, overwrite)
				return err
			}
			if err := write("a.csv", 10, false); err != nil {
				t.Fatal(err)
			}
			entries, _ := f.List("c1")
			if len(entries) != 1 || entries[0].Name != "a.csv" || entries[0].Size != 10 {
				t.Errorf("entries %+v", entries)
			}
			var st syscall.Stat_t
			syscall.Stat(filepath.Join(f.Path("c1"), "a.csv"), &st)
			if st.Uid != 1000 {
				t.Errorf("owner %d, want the sandbox user", st.Uid)
			}
			tests := []struct {
				name      string
				size      int
				overwrite bool
				code      string
			}{
				{"a.csv", 5, false, runbox.EFileExists},
				{"a.csv", 5, true, ""},
				{"big.bin", 3<<20 + 1, false, runbox.ETooLarge},
				{"../x", 1, false, runbox.EInvalidPath},
				{"/etc/passwd", 1, false, runbox.EInvalidPath},
				{"a/b", 1, false, runbox.EInvalidPath},
				{".env", 1, false, runbox.EInvalidPath},
				{"a\x00b", 1, false, runbox.EInvalidPath},
				{strings.Repeat("n", 256), 1, false, runbox.EInvalidPath},
				{"", 1, false, runbox.EInvalidPath},
				{"b1.bin", 3 << 20, false, ""},
				{"b2.bin", 2 << 20, false, runbox.EQuotaExceeded},
			}
			for _, tt := range tests {
				err := write(tt.name, tt.size, tt.overwrite)
				if tt.code == "" && err != nil || tt.code != "" && runbox.ErrorCode(err) != tt.code {
					t.Errorf("write %.20q: %v, want %q", tt.name, err, tt.code)
				}
			}
			if used, _, _ := f.Usage("c1"); used > 4<<20 {
				t.Errorf("used %d bytes, over the quota", used)
			}
			if _, err := os.Stat(filepath.Join(root, "x")); err == nil {
				t.Error("a write escaped the folder")
			}
			entries, _ = f.List("c1")
			if len(entries) != 2 {
				t.Errorf("after the refused writes: %+v", entries)
			}
			if err := f.Remove("c1"); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(filepath.Join(root, "c1")); !os.IsNotExist(err) {
				t.Errorf("conversation folder left: %v", err)
			}
		})
	}
}

func unmountAll(root string) {
	b, _ := os.ReadFile("/proc/self/mountinfo")
	for line := range strings.SplitSeq(string(b), "\n") {
		if fields := strings.Fields(line); len(fields) > 4 && strings.HasPrefix(fields[4], root) {
			unmount(fields[4])
		}
	}
}

func TestSlots(t *testing.T) {
	for _, mode := range []QuotaMode{QuotaWalk, QuotaLoop} {
		t.Run(string(mode), func(t *testing.T) {
			needLoop(t, mode)
			root := t.TempDir()
			t.Cleanup(func() { unmountAll(root) })
			f, err := NewFolders(root, Options{UID: os.Getuid(), GID: os.Getgid(), Quota: 4 << 20, Mode: mode})
			if err != nil {
				t.Fatal(err)
			}
			slot, err := f.NewSlot("ex1-a")
			if err != nil {
				t.Fatal(err)
			}
			// A sandbox holds the slot open, as a bind mount would.
			held, _, _ := hold(t, slot)
			dir, err := f.Adopt(slot, "newconv")
			if err != nil {
				t.Fatal(err)
			}
			if dir != f.Path("newconv") {
				t.Errorf("adopted folder %s", dir)
			}
			// What is written through the held folder is the conversation's.
			os.WriteFile(filepath.Join(dir, "x.txt"), []byte("x"), 0o644)
			if names, _ := held.Readdirnames(-1); len(names) == 0 || !slices.Contains(names, "x.txt") {
				t.Errorf("the held slot does not see the conversation's file: %v", names)
			}
			if _, err := f.Ensure("newconv"); err != nil {
				t.Fatal(err)
			}
			if f.HardQuota() {
				if mounted, _ := isMountPoint(dir); !mounted {
					t.Error("the adopted folder is not its disk image")
				}
			}
			// A conversation that has a folder is never replaced.
			slot2, _ := f.NewSlot("ex1-b")
			if _, err := f.Adopt(slot2, "newconv"); !errors.Is(err, ErrConversationExists) {
				t.Errorf("adopting onto an existing conversation: %v", err)
			}
			f.NewSlot("ex2-c")
			if err := f.RemoveSlots("ex1-"); err != nil {
				t.Fatal(err)
			}
			left, _ := os.ReadDir(filepath.Join(root, slotsDir))
			if len(left) != 1 || left[0].Name() != "ex2-c" {
				t.Errorf("slots left: %v", left)
			}
			if err := f.RemoveSlots(""); err != nil {
				t.Fatal(err)
			}
			if convs, _ := f.Conversations(); len(convs) != 1 || convs[0].ID != "newconv" {
				t.Errorf("conversations %v", convs)
			}
		})
	}
}

// TestWalkBounded: walk mode counts every entry (empty files included)
// and every byte, however far past the quota, so that what a run adds to a
// conversation already past it shows; past the entry limit the folder is
// full; a folder it cannot walk in time is unmeasurable.
func TestWalkBounded(t *testing.T) {
	const quota = 1 << 20
	tests := []struct {
		name    string
		files   int           // entries the limit allows
		make    int           // empty files to create
		big     int64         // bytes of one more file
		timeout time.Duration // of a measurement; 0 for walkTime
		full    bool          // reported full
		atLeast int64         // used is at least this
		err     error
	}{
		{name: "within both", files: 100, make: 50, atLeast: 50 * minEntryBytes},
		{name: "past the entry limit", files: 100, make: 150, full: true, atLeast: 150 * minEntryBytes},
		{name: "empty files cost their inode", make: 300, full: true, atLeast: 300 * minEntryBytes}, // 300 × 4 KiB > 1 MiB
		{name: "counted past the quota", files: 100, make: 10, big: 3 * quota, full: true, atLeast: 3*quota + 10*minEntryBytes},
		{name: "too slow to walk", files: 100, make: 10, timeout: time.Nanosecond, full: true, err: ErrUnmeasurable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			for i := range tt.make {
				if err := os.WriteFile(filepath.Join(dir, "f"+strconv.Itoa(i)), nil, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if tt.big > 0 {
				if err := os.WriteFile(filepath.Join(dir, "big"), make([]byte, tt.big), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			w := walkSpace{quota: quota, files: tt.files, timeout: cmp.Or(tt.timeout, walkTime)}
			used, free, err := w.usage(dir)
			if !errors.Is(err, tt.err) {
				t.Fatalf("err = %v, want %v", err, tt.err)
			}
			if full := free == 0; full != tt.full || used < tt.atLeast {
				t.Errorf("used %d free %d: full = %v, want %v, used at least %d", used, free, full, tt.full, tt.atLeast)
			}
		})
	}
}

// TestLoopRemountsOnRead: a conversation whose image the janitor released
// is mounted again by the first read, which sees its files.
func TestLoopRemountsOnRead(t *testing.T) {
	needLoop(t, QuotaLoop)
	root := t.TempDir()
	t.Cleanup(func() { unmountAll(root) })
	f, err := NewFolders(root, Options{UID: os.Getuid(), GID: os.Getgid(), Quota: 4 << 20, Mode: QuotaLoop})
	if err != nil {
		t.Fatal(err)
	}
	dir, err := f.Ensure("c")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "kept.txt"), []byte("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	idle := func(time.Time) bool { return true }
	if done, err := f.Release("c", idle); !done || err != nil {
		t.Fatalf("release: %v, %v", done, err)
	}
	for name, read := range map[string]func() bool{
		"list": func() bool { l, err := f.List("c"); return err == nil && len(l) == 1 },
		"open": func() bool { file, _, err := f.Open("c", "kept.txt"); file.Close(); return err == nil },
	} {
		if _, err := f.Release("c", idle); err != nil {
			t.Fatal(err)
		}
		if !read() {
			t.Errorf("%s after release does not see the file", name)
		}
	}
	// A conversation used since the caller looked is not released.
	if done, _ := f.Release("c", func(time.Time) bool { return false }); done {
		t.Error("released a conversation its check kept")
	}
}

// hold opens dir as a sandbox's bind mount holds it; mounted says whether
// a path names that folder.
func hold(t *testing.T, dir string) (held *os.File, info os.FileInfo, mounted func(string) bool) {
	t.Helper()
	held, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { held.Close() })
	info, _ = held.Stat()
	return held, info, func(d string) bool {
		fi, err := os.Stat(d)
		return err == nil && os.SameFile(fi, info)
	}
}

// TestRecycle: the folder a sandbox mounts leaves its conversation empty,
// as a slot; the conversation keeps every file (hidden ones, folders,
// links; in loop mode copies in a new image) in a new folder; a folder
// made anew since is not recycled.
func TestRecycle(t *testing.T) {
	for _, mode := range []QuotaMode{QuotaWalk, QuotaLoop} {
		t.Run(string(mode), func(t *testing.T) { testRecycle(t, mode) })
	}
}

func testRecycle(t *testing.T, mode QuotaMode) {
	f, dir := newFoldersIn(t, mode)
	os.Symlink("/etc/passwd", filepath.Join(dir, "link"))
	old := time.Unix(1_000_000, 0)
	os.WriteFile(filepath.Join(dir, "a.csv"), []byte("a"), 0o644)
	os.WriteFile(filepath.Join(dir, ".hidden"), []byte("h"), 0o644)
	os.MkdirAll(filepath.Join(dir, "sub", "deep"), 0o755)
	os.WriteFile(filepath.Join(dir, "sub", "deep", "b.txt"), []byte("b"), 0o640)
	os.Chtimes(filepath.Join(dir, "a.csv"), old, old)
	// The sandbox holds the folder, as a bind mount would.
	held, heldInfo, mounted := hold(t, dir)
	idle := time.Now()
	if _, err := f.Recycle("conv1", "ex-r1", func(string) bool { return false }, idle); err == nil {
		t.Fatal("recycled a folder the sandbox does not mount")
	}
	if _, err := f.Recycle("conv1", "ex-r1", mounted, idle.Add(-time.Hour)); err == nil {
		t.Fatal("recycled a folder used since its sandbox went idle")
	}
	slot, err := f.Recycle("conv1", "ex-r1", mounted, idle)
	if err != nil {
		t.Fatal(err)
	}
	if names, _ := held.Readdirnames(-1); len(names) != 0 {
		t.Errorf("the sandbox still sees %v", names)
	}
	if fi, _ := os.Stat(slot); !os.SameFile(fi, heldInfo) {
		t.Error("the slot is not the sandbox's folder")
	}
	for _, name := range []string{"a.csv", ".hidden", "sub/deep/b.txt", "link"} {
		if _, err := os.Lstat(filepath.Join(f.Path("conv1"), name)); err != nil {
			t.Errorf("the conversation lost %s: %v", name, err)
		}
	}
	if target, _ := os.Readlink(filepath.Join(f.Path("conv1"), "link")); target != "/etc/passwd" {
		t.Errorf("the link became %q", target)
	}
	if fi, _ := os.Stat(filepath.Join(f.Path("conv1"), "a.csv")); fi == nil || !fi.ModTime().Equal(old) {
		t.Errorf("a.csv lost its time: %v", fi)
	}
	if fi, _ := os.Stat(filepath.Join(f.Path("conv1"), "sub/deep/b.txt")); fi == nil || fi.Mode().Perm() != 0o640 {
		t.Errorf("b.txt lost its mode: %v", fi)
	}
	if b, _ := os.ReadFile(filepath.Join(f.Path("conv1"), "sub/deep/b.txt")); string(b) != "b" {
		t.Errorf("b.txt holds %q", b)
	}
	// The conversation's lock still excludes: it is the one its path names.
	unlock, err := f.lockValid("conv1")
	if err != nil {
		t.Fatal(err)
	}
	unlock()
	if fi, _ := os.Stat(f.Path("conv1")); os.SameFile(fi, heldInfo) {
		t.Error("the conversation's path still names the sandbox's folder")
	}
	// The slot serves a new conversation.
	if _, err := f.Adopt(slot, "conv2"); err != nil {
		t.Fatal(err)
	}
	if names, _ := os.ReadDir(f.Path("conv2")); len(names) != 0 {
		t.Errorf("the new conversation sees %v", names)
	}
}

// TestRecycleEmpty: a conversation with no files is handed over without
// a disk image of its own; its next use makes one (the quota holds), and
// it moves into another sandbox with nothing to copy.
func TestRecycleEmpty(t *testing.T) {
	for _, mode := range []QuotaMode{QuotaWalk, QuotaLoop} {
		t.Run(string(mode), func(t *testing.T) { testRecycleEmpty(t, mode) })
	}
}

func testRecycleEmpty(t *testing.T, mode QuotaMode) {
	f, dir := newFoldersIn(t, mode)
	held, heldInfo, mounted := hold(t, dir)
	slot, err := f.Recycle("conv1", "ex-e1", mounted, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(slot); !os.SameFile(fi, heldInfo) {
		t.Error("the slot is not the sandbox's folder")
	}
	img := filepath.Join(f.convDir("conv1"), "files.img")
	if _, err := os.Stat(img); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the empty conversation has a disk image: %v", err)
	}
	if names, _ := held.Readdirnames(-1); len(names) != 0 {
		t.Errorf("the sandbox sees %v", names)
	}

	// Its next sandbox takes it with nothing to copy, and no image made.
	next, err := f.NewSlot("ex-e2")
	if err != nil {
		t.Fatal(err)
	}
	nextHeld, _, nextMounted := hold(t, next)
	if _, err := f.MoveInto(next, "conv1"); err != nil {
		t.Fatal(err)
	}
	if !nextMounted(f.Path("conv1")) {
		t.Error("the conversation's path does not name the sandbox's folder")
	}
	if _, err := os.Stat(filepath.Dir(next)); !os.IsNotExist(err) {
		t.Errorf("the slot is left: %v", err)
	}
	// Handed over again, then used: the quota is whole.
	if _, err := f.Recycle("conv1", "ex-e3", nextMounted, time.Now()); err != nil {
		t.Fatal(err)
	}
	_ = nextHeld
	if _, err := f.Write("conv1", "big.bin", strings.NewReader(strings.Repeat("x", 9<<20)), 64<<20, false); err == nil {
		t.Error("an upload past the quota was taken")
	}
	if _, err := f.Write("conv1", "small.bin", strings.NewReader("x"), 64<<20, false); err != nil {
		t.Fatal(err)
	}
	if mode == QuotaLoop {
		if _, err := os.Stat(img); err != nil {
			t.Errorf("the used conversation has no disk image: %v", err)
		}
		if m, _ := isMountPoint(f.Path("conv1")); !m {
			t.Error("the used conversation's image is not mounted")
		}
	}
}

// TestMoveInto: a conversation's files move into a slot's folder, which
// takes the conversation's path; the sandbox holding the slot sees them.
func TestMoveInto(t *testing.T) {
	for _, mode := range []QuotaMode{QuotaWalk, QuotaLoop} {
		t.Run(string(mode), func(t *testing.T) { testMoveInto(t, mode) })
	}
}

func testMoveInto(t *testing.T, mode QuotaMode) {
	f, dir := newFoldersIn(t, mode)
	os.WriteFile(filepath.Join(dir, "a.csv"), []byte("a"), 0o644)
	os.MkdirAll(filepath.Join(dir, "sub"), 0o755)
	slot, err := f.NewSlot("ex-m1")
	if err != nil {
		t.Fatal(err)
	}
	held, _, _ := hold(t, slot)
	got, err := f.MoveInto(slot, "conv1")
	if err != nil || got != f.Path("conv1") {
		t.Fatalf("MoveInto = %s, %v", got, err)
	}
	names, _ := held.Readdirnames(-1)
	slices.Sort(names)
	if !slices.Equal(names, []string{"a.csv", "sub"}) {
		t.Errorf("the sandbox sees %v", names)
	}
	if _, err := os.Stat(filepath.Dir(slot)); !os.IsNotExist(err) {
		t.Errorf("the slot is left: %v", err)
	}
}

// gate is a reader that yields nothing until opened, then EOF.
type gate chan struct{}

func (g gate) Read([]byte) (int, error) { <-g; return 0, io.EOF }

// TestRecycleWaitsForUploads: an upload under way holds the conversation,
// so its file lands in the conversation's folder, never in the folder
// that goes to another conversation.
func TestRecycleWaitsForUploads(t *testing.T) {
	f, dir := newFolders(t)
	_, _, mounted := hold(t, dir)
	idle := time.Now().Add(time.Hour)
	g := make(gate)
	uploaded := make(chan error, 1)
	go func() {
		_, err := f.Write("conv1", "late.txt", g, 100, false)
		uploaded <- err
	}()
	// The upload takes the lock first (it is waiting on its body).
	for {
		entries, _ := os.ReadDir(dir)
		if len(entries) > 0 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	recycled := make(chan error, 1)
	var slot string
	go func() {
		var err error
		slot, err = f.Recycle("conv1", "ex-r2", mounted, idle)
		recycled <- err
	}()
	select {
	case err := <-recycled:
		t.Fatalf("the folder changed hands during an upload (%v)", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(g)
	if err := <-uploaded; err != nil {
		t.Fatal(err)
	}
	if err := <-recycled; err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(f.Path("conv1"), "late.txt")); err != nil {
		t.Errorf("the upload is not the conversation's: %v", err)
	}
	if names, _ := os.ReadDir(slot); len(names) != 0 {
		t.Errorf("the recycled folder holds %v", names)
	}
}

// TestCopyTree: what a loop-mode hand-over copies, and where it stops.
func TestCopyTree(t *testing.T) {
	src, dst := t.TempDir(), t.TempDir()
	os.WriteFile(filepath.Join(src, "f"), []byte("0123456789"), 0o4755) // set-id bits are dropped
	syscall.Mkfifo(filepath.Join(src, "fifo"), 0o644)
	os.Symlink("../../etc", filepath.Join(src, "out"))
	if err := copyTree(src, dst, 100, os.Getuid(), os.Getgid()); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(filepath.Join(dst, "f")); err != nil || fi.Mode() != 0o755 {
		t.Errorf("f: %v, %v", fi, err)
	}
	if _, err := os.Lstat(filepath.Join(dst, "fifo")); !os.IsNotExist(err) {
		t.Errorf("a FIFO was copied: %v", err)
	}
	if fi, err := os.Lstat(filepath.Join(dst, "out")); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Errorf("the link was not copied as a link: %v, %v", fi, err)
	}
	if err := copyTree(src, t.TempDir(), 5, os.Getuid(), os.Getgid()); err == nil {
		t.Error("copied past the limit")
	}
}
