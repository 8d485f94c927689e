package app

import (
	"bufio"
	"io"
	"os"
	"strconv"
	"strings"
)

// availableMemory is the memory this host has available for new work
// (MemAvailable of /proc/meminfo), in bytes; 0 when it cannot be told.
func availableMemory() int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	return memAvailable(f)
}

// memAvailable reads MemAvailable from a /proc/meminfo.
func memAvailable(r io.Reader) int64 {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "MemAvailable:")
		if !ok {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
		if err != nil || kb < 0 {
			return 0
		}
		return kb << 10
	}
	return 0
}
