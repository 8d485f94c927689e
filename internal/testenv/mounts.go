package testenv

import (
	"bufio"
	"os"
	"os/exec"
	"sort"
	"strings"
	"testing"
)

// UnmountUnder unmounts every mount below dir (conversation disk images a
// test left mounted), deepest first, so that the folder can be removed.
func UnmountUnder(t testing.TB, dir string) {
	t.Helper()
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return
	}
	defer f.Close()
	var mounts []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && strings.HasPrefix(fields[4], dir+"/") {
			mounts = append(mounts, fields[4])
		}
	}
	sort.Sort(sort.Reverse(sort.StringSlice(mounts)))
	for _, m := range mounts {
		if out, err := exec.Command("umount", m).CombinedOutput(); err != nil {
			t.Logf("umount %s: %v: %s", m, err, out)
		}
	}
}
