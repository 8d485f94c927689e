#!/bin/bash
# Runs the single-node test cluster (up.sh) with its state in DIR until
# its standard input ends or it is told to stop (SIGINT, SIGTERM, SIGHUP),
# then stops it and restores the host (down.sh). It prints "ready" on its
# standard output once the cluster is up; everything else goes to
# standard error.
#
# One cluster runs on a machine at a time: a second run.sh waits for the
# first to finish (up to K8S_LOCK_WAIT seconds, 1800 by default). A
# cluster whose run.sh was killed (SIGKILL) is stopped by the next
# run.sh before it starts its own.
#
# This is what internal/testenv.Kubernetes runs; by hand:
#   deploy/k8s-cluster/run.sh /tmp/k8s    # Ctrl-C stops it
#   export $(grep KUBECONFIG /tmp/k8s/cluster.env)
set -uo pipefail
. "$(dirname "$0")/lib.sh"
[ $# = 1 ] || die "usage: $0 DIR"
[ "$(id -u)" = 0 ] || die "k8s-cluster: runs as root (it sets up networks and cgroups)"
mkdir -p "$1"
dir=$(cd "$1" && pwd)
lock=/run/lock/runbox-k8s-cluster.lock
last=/run/lock/runbox-k8s-cluster.dir

exec 9> "$lock"
if ! flock -n 9; then
  log "k8s-cluster: waiting for the cluster another run holds"
  flock -w "${K8S_LOCK_WAIT:-1800}" 9 || die "k8s-cluster: the machine's cluster is still in use"
fi
if [ -s "$last" ]; then
  # The last run ended without its down.sh.
  "$K8S_HERE/down.sh" "$(cat "$last")" || die "k8s-cluster: the last cluster ($(cat "$last")) could not be cleaned up"
fi
echo "$dir" > "$last"

# finish [RC]: stops the cluster; exits with RC, or down.sh's status.
finish() {
  trap '' INT TERM HUP
  "$K8S_HERE/down.sh" "$dir"
  local rc=$?
  [ $rc = 0 ] && rm -f "$last"
  exit "${1:-$rc}"
}
trap finish INT TERM HUP

"$K8S_HERE/up.sh" "$dir" || finish 1
echo ready
# Until standard input ends (the caller is gone, or is done). read is a
# builtin: a signal interrupts it and runs the trap.
while read -r _; do :; done
finish
