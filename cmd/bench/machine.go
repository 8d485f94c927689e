package main

import (
	"fmt"
	"os/exec"
	"slices"
	"syscall"
	"time"
)

// machineRow measures what a sandbox's processes cost on this machine,
// beside which the other rows are read: a page fault (a fork copies pages
// by faults, an exit frees them) and a process spawned and reaped. A
// virtual machine without nested paging makes both tens of times dearer
// than on bare metal (a page fault measured 16 µs on one such day here),
// and with them every start, reset and run of a sandbox, while the rest
// of runbox costs what it did.
func machineRow() row {
	r := row{
		measure:  "this machine, what the rows are read beside: a page's first touch (a fault); a process spawned and reaped (`/bin/true`), median",
		baseline: "—", ratio: "—", target: "—", met: true,
	}
	fault, err := pageFault()
	if err == nil {
		var spawn time.Duration
		spawn, err = spawnTime()
		r.result = fmt.Sprintf("%.2f µs; %s", float64(fault.Nanoseconds())/1e3, ms(spawn))
	}
	if err != nil {
		r.result = "not measured: " + err.Error()
	}
	return r
}

// spawnTime returns the median time of 50 runs of /bin/true.
func spawnTime() (time.Duration, error) {
	spawns := make([]time.Duration, 50)
	for i := range spawns {
		t := time.Now()
		if err := exec.Command("/bin/true").Run(); err != nil {
			return 0, err
		}
		spawns[i] = time.Since(t)
	}
	slices.Sort(spawns)
	return spawns[len(spawns)/2], nil
}

// pageFault returns the time one first touch of a fresh anonymous page
// takes, over 64 MiB.
func pageFault() (time.Duration, error) {
	const size, page = 64 << 20, 4096
	mem, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	if err != nil {
		return 0, fmt.Errorf("mmap: %w", err)
	}
	defer syscall.Munmap(mem)
	t := time.Now()
	for i := 0; i < size; i += page {
		mem[i] = 1
	}
	return time.Since(t) / (size / page), nil
}
