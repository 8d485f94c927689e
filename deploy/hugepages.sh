#!/bin/sh
# Lets gVisor back sandboxes' memory with huge pages (deploy/runsc.sh runs
# it). gVisor does so only where the host lets shared memory have them
# when asked and does not stall such requests for compaction (runsc
# --app-huge-pages, on by default; its log says "Disabling application huge
# pages" otherwise). The kernel's defaults (shmem_enabled=never,
# defrag=madvise) keep them off, and every range a process copies after a
# fork is then small pages committed, mapped and given back one at a time:
# warm runs ~12 % slower here (docs/performance.md, section 10). Where
# huge shared memory is off, this sets shmem_enabled=advise (only memory
# whose owner asks, as gVisor does, gets them; nothing else changes) and,
# where defrag is madvise or defer+madvise, defrag=defer (a request waits
# for no compaction: kcompactd makes huge pages in the background, and a
# request that finds none gets small pages). Other settings an operator
# chose are kept, shmem_enabled=deny (an emergency switch) above all.
# These are settings of the running kernel, lost at reboot: `make deps`
# sets them again.
#
# Usage: deploy/hugepages.sh   (THP_DIR names the settings' directory;
# /sys/kernel/mm/transparent_hugepage by default)
set -eu
thp=${THP_DIR:-/sys/kernel/mm/transparent_hugepage}

. "$(dirname "$0")/lib.sh"

# setting prints the selected value of the setting $1 ("[advise]").
setting() {
  sed -n 's/.*\[\(.*\)\].*/\1/p' "$thp/$1" 2>/dev/null
}

# set_to sets the setting $1, now $2, to $3, saying so.
set_to() {
  root_or_sudo "hugepages: setting $thp/$1 needs root: sudo $0 (or RUNSC_HOST_THP=keep)"
  echo "$3" | $sudo tee "$thp/$1" >/dev/null
  echo "hugepages: $thp/$1 = $3 (was $2), for gVisor's huge pages" >&2
}

shmem=$(setting shmem_enabled)
if [ "$shmem" = never ]; then
  set_to shmem_enabled never advise
  shmem=advise
fi
defrag=$(setting defrag)
if [ "$shmem" = advise ] && { [ "$defrag" = madvise ] || [ "$defrag" = defer+madvise ]; }; then
  set_to defrag "$defrag" defer
fi
