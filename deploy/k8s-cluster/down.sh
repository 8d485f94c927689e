#!/bin/bash
# Stops the test cluster up.sh started in DIR and puts the host back as it
# was: its processes and their shims, its pods' processes, mounts and
# network namespaces, the bridge, the cgroups, kube-proxy's nftables
# tables, kube-router's iptables chains and ipsets, the sysctls and the
# host folders the cluster made. Only what this cluster made: processes
# are those whose environment names DIR, chains and sets those with the
# names kube-proxy and kube-router give theirs (one cluster a machine:
# run.sh's lock).
#
# It then checks that nothing is left and fails, naming it, if something
# is. DIR itself is kept (its logs); the caller removes it.
#
# Usage: down.sh DIR
set -uo pipefail
. "$(dirname "$0")/lib.sh"
k8s_dirs
[ $# = 1 ] || die "usage: $0 DIR"
[ -d "$1" ] || exit 0
dir=$(cd "$1" && pwd)
[ -f "$dir/cluster.env" ] || exit 0
# shellcheck disable=SC1091
. "$dir/cluster.env"
export KUBECONFIG
kubectl=$K8S_BIN/kubectl
ctr() { timeout 30 "$K8S_CTR" -a "$K8S_CONTAINERD" -n k8s.io "$@"; }

alive() { [ -f "$dir/pids/$1" ] && running "$(cat "$dir/pids/$1")"; }
# running PID: the process is one of this cluster's and has not exited
# (a zombie waits for init to reap it).
running() { ours "$1" && ! grep -q '^State:[[:space:]]*Z' "/proc/$1/status" 2>/dev/null; }
# ours PID: the process is one of this cluster's (its environment says so).
ours() { tr '\0' '\n' 2>/dev/null < "/proc/$1/environ" | grep -qxF "RUNBOX_K8S_CLUSTER=$dir"; }
# stop NAME...: SIGTERM, then SIGKILL to what is left after 10 s.
stop() {
  local pids="" p
  for name in "$@"; do
    alive "$name" && pids="$pids $(cat "$dir/pids/$name")"
    rm -f "$dir/pids/$name"
  done
  [ -n "$pids" ] || return 0
  kill -TERM $pids 2>/dev/null
  for _ in $(seq 100); do
    left=""
    for p in $pids; do running "$p" && left="$left $p"; done
    [ -n "$left" ] || return 0
    sleep 0.1
  done
  kill -KILL $left 2>/dev/null
}

# 1. Pods go the way the kubelet takes them down: their networks through
# CNI, their mounts, their cgroups.
if alive kube-apiserver && alive kubelet; then
  timeout 90 "$kubectl" delete pods --all --all-namespaces --grace-period=1 --wait=true > /dev/null 2>&1
fi
stop kubelet
stop kube-router kube-proxy coredns kube-scheduler kube-controller-manager kube-apiserver

# 2. What is left of containers: killed and removed through containerd.
if alive containerd; then
  for t in $(ctr tasks ls -q 2>/dev/null); do ctr tasks kill -a -s SIGKILL "$t" > /dev/null 2>&1; done
  for t in $(ctr tasks ls -q 2>/dev/null); do ctr tasks delete -f "$t" > /dev/null 2>&1; done
  for c in $(ctr containers ls -q 2>/dev/null); do ctr containers delete "$c" > /dev/null 2>&1; done
  for s in $(ctr sandboxes ls -q 2>/dev/null); do ctr sandboxes rm -f "$s" > /dev/null 2>&1; done
fi
stop containerd etcd
# Shims, runsc sandboxes and anything else this cluster started.
for pid in $(ls /proc | grep -E '^[0-9]+$'); do
  [ "$pid" != $$ ] && running "$pid" && kill -KILL "$pid" 2>/dev/null
done
# Containers' own processes: in the cluster's cgroups.
if grep -qx '/sys/fs/cgroup/pids/kubepods' "$dir/before/absent" 2>/dev/null; then
  for pid in $(find /sys/fs/cgroup/pids/kubepods -name cgroup.procs -exec cat {} + 2>/dev/null); do
    kill -KILL "$pid" 2>/dev/null
  done
fi
sleep 0.5

# 3. Mounts (containers' root filesystems, network namespaces, volumes).
for root in "$dir" "$K8S_IMAGES"; do
  awk '{print $2}' /proc/self/mounts | grep -F "$root/" | sort -r | while read -r m; do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null
  done
done
ip link delete "$K8S_BRIDGE" 2>/dev/null

# 4. Cgroups the kubelet made: the kubepods trees, deepest first.
while read -r p; do
  case $p in
    /sys/fs/cgroup/*/kubepods)
      [ -d "$p" ] && find "$p" -depth -type d -exec rmdir {} + 2>/dev/null ;;
  esac
done < "$dir/before/absent"

# 5. Firewall: kube-proxy's nftables tables, kube-router's chains and sets.
nft delete table ip kube-proxy 2>/dev/null
nft delete table ip6 kube-proxy 2>/dev/null
for save in iptables-save ip6tables-save; do
  restore=${save/-save/-restore}
  for table in filter nat mangle raw; do
    rules=$($save -t $table 2>/dev/null) || continue
    chains=$(sed -n 's/^:\(KUBE-[^ ]*\) .*/\1/p' <<<"$rules")
    [ -n "$chains" ] || continue
    # Jumps into them from any other chain, then the chains themselves.
    {
      echo "*$table"
      grep -E -- '-j KUBE-' <<<"$rules" | grep -vE '^-A KUBE-' | sed 's/^-A /-D /'
      for c in $chains; do echo "-F $c"; done
      for c in $chains; do echo "-X $c"; done
      echo COMMIT
    } | ${restore} --noflush 2>/dev/null
  done
done
for s in $(ipset list -n 2>/dev/null | grep -E '^(KUBE-|inet6:KUBE-)'); do ipset destroy "$s" 2>/dev/null; done

# 6. Sysctls, and the host folders the cluster made.
while IFS='=' read -r k v; do
  [ "$(sysctl -n "$k" 2>/dev/null)" = "$v" ] || sysctl -qw "$k=$v"
done < "$dir/before/sysctl"
while read -r p; do
  case $p in
    /sys/fs/cgroup/*) ;;
    /run/containerd)
      # Shim sockets only, and only if nothing else put anything there.
      [ -d "$p" ] && find "$p" -type s -delete 2>/dev/null && find "$p" -depth -type d -empty -delete ;;
    *) [ -e "$p" ] && rm -rf "$p" ;;
  esac
done < "$dir/before/absent"
if [ -d /run/containerd/s ] && [ -f "$dir/before/shim-sockets" ]; then
  for s in /run/containerd/s/*; do
    [ -S "$s" ] || continue
    grep -qxF "$(basename "$s")" "$dir/before/shim-sockets" && continue
    # A socket no process listens on any more.
    ss -Hxl | grep -qF "$s" || rm -f "$s"
  done
fi

# 7. Check.
left=""
for pid in $(ls /proc | grep -E '^[0-9]+$'); do
  [ "$pid" != $$ ] && running "$pid" && left="$left process $pid ($(tr '\0' ' ' < /proc/$pid/cmdline | cut -c1-80));"
done
m=$(awk '{print $2}' /proc/self/mounts | grep -F -e "$dir/" -e "$K8S_IMAGES/" | head -3 | tr '\n' ' ')
[ -z "$m" ] || left="$left mounts $m;"
ip link show "$K8S_BRIDGE" > /dev/null 2>&1 && left="$left bridge $K8S_BRIDGE;"
nft list tables 2>/dev/null | grep -q kube-proxy && left="$left nftables table kube-proxy;"
c=$(iptables-save 2>/dev/null | grep -c '^:KUBE-')
[ "$c" = 0 ] || left="$left $c iptables chains KUBE-*;"
ipset list -n 2>/dev/null | grep -q KUBE- && left="$left ipsets KUBE-*;"
while read -r p; do [ -e "$p" ] && left="$left $p;"; done < "$dir/before/absent"
while IFS='=' read -r k v; do
  [ "$(sysctl -n "$k" 2>/dev/null)" = "$v" ] || left="$left sysctl $k=$(sysctl -n "$k") (was $v);"
done < "$dir/before/sysctl"
if [ -n "$left" ]; then
  log "k8s-cluster: left behind:$left"
  exit 1
fi
rm -f "$dir/cluster.env"
log "k8s-cluster: down; nothing left behind"
