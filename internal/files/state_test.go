package files

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestStateTakesSandboxRoom checks that while a conversation has a saved
// state of S bytes, here (PutState) or in a remote store (HoldState), its
// sandbox's user may write at most the quota less S, and the whole quota
// again once the state is gone; Usage counts the state once.
func TestStateTakesSandboxRoom(t *testing.T) {
	const (
		quota = 16 << 20
		state = 6 << 20
		cid   = "c1"
	)
	ctx := context.Background()
	ways := []struct {
		name          string
		save, discard func(f *Folders) error
	}{
		{"host", func(f *Folders) error {
			_, err := f.PutState(ctx, cid, strings.NewReader(strings.Repeat("s", state)), state)
			return err
		}, func(f *Folders) error { return f.RemoveState(ctx, cid) }},
		{"remote", func(f *Folders) error { return f.HoldState(cid, state) },
			func(f *Folders) error { return f.HoldState(cid, 0) }},
	}
	for _, mode := range []QuotaMode{QuotaWalk, QuotaLoop} {
		for _, way := range ways {
			t.Run(string(mode)+"/"+way.name, func(t *testing.T) {
				needLoop(t, mode)
				root := sandboxReadable(t)
				t.Cleanup(func() { unmountAll(root) })
				f, err := NewFolders(root, Options{UID: 1000, GID: 1000, Quota: quota, Mode: mode})
				if err != nil {
					t.Fatal(err)
				}
				dir, err := f.Ensure(cid)
				if err != nil {
					t.Fatal(err)
				}
				used0, free0, err := f.Usage(cid)
				if err != nil {
					t.Fatal(err)
				}
				if err := way.save(f); err != nil {
					t.Fatal(err)
				}
				used1, free1, err := f.Usage(cid)
				if err != nil {
					t.Fatal(err)
				}
				// Counted once: in used, and out of free (to the block).
				if used1-used0 != state || free1 > free0-state || free1 < free0-state-8192 {
					t.Fatalf("with the state: used %d, free %d; without: used %d, free %d", used1, free1, used0, free0)
				}
				if mode == QuotaWalk {
					if err := way.discard(f); err != nil {
						t.Fatal(err)
					}
					if used, free, _ := f.Usage(cid); used != used0 || free != free0 {
						t.Errorf("after its removal: used %d, free %d; want %d, %d", used, free, used0, free0)
					}
					return
				}
				// The kernel holds the room, through a remount too.
				if err := f.space.release(dir); err != nil {
					t.Fatal(err)
				}
				if _, err := f.Ensure(cid); err != nil {
					t.Fatal(err)
				}
				if avail := bavail(t, dir); avail > free0-state {
					t.Errorf("after a remount the image has %d bytes free, want at most %d", avail, free0-state)
				}
				big := filepath.Join(dir, "big")
				over := free1 + 1<<20
				for _, cmd := range [][]string{
					{"dd", "if=/dev/zero", "of=" + big, "bs=64k", fmt.Sprint("count=", over/(64<<10)), "conv=fsync"},
					{"fallocate", "-l", fmt.Sprint(over), big + "2"},
				} {
					if out, err := asSandboxUser(t, cmd...); err == nil || !strings.Contains(out, "No space left") {
						t.Errorf("%s past the quota less the state: %v: %s", cmd[0], err, out)
					}
				}
				if info, err := os.Stat(big); err == nil && info.Size() > free1 {
					t.Errorf("wrote %d bytes, the quota less the state leaves %d", info.Size(), free1)
				}
				os.Remove(big)
				os.Remove(big + "2")

				if err := way.discard(f); err != nil {
					t.Fatal(err)
				}
				used2, free2, err := f.Usage(cid)
				if err != nil {
					t.Fatal(err)
				}
				if used2 != used0 || free2 < free0-8192 {
					t.Fatalf("after its removal: used %d, free %d; want %d, %d", used2, free2, used0, free0)
				}
				fill := (free2 - 256<<10) / (64 << 10)
				if out, err := asSandboxUser(t, "dd", "if=/dev/zero", "of="+big, "bs=64k", fmt.Sprint("count=", fill), "conv=fsync"); err != nil {
					t.Errorf("writing %d bytes once the state is gone: %v: %s", fill*64<<10, err, out)
				}
				if fill*64<<10 < over {
					t.Errorf("only %d bytes free once the state is gone", free2)
				}
			})
		}
	}
}

// sandboxReadable returns a fresh folder that the sandbox's user may
// reach.
func sandboxReadable(t *testing.T) string {
	root := t.TempDir()
	for d := root; d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// asSandboxUser runs a command as the sandbox's user, uid and gid 1000.
func asSandboxUser(t *testing.T, args ...string) (string, error) {
	if _, err := exec.LookPath(args[0]); err != nil {
		t.Skipf("%s is not installed", args[0])
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 1000, Gid: 1000}}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func bavail(t *testing.T, dir string) int64 {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Bavail) * st.Bsize
}
