#!/bin/bash
# Builds what the single-node test cluster runs (deploy/k8s-cluster) into
# $K8S_CACHE (lib.sh), each component once: a second run finds them all
# and returns at once. From an empty Go build cache it takes 17 minutes
# of CPU, more than half of it Kubernetes: 10 to 50 minutes on two cores,
# as idle or as busy as they are.
#
#   Kubernetes $K8S_VERSION   kube-apiserver, kube-controller-manager,
#                             kube-scheduler, kubelet, kube-proxy, kubectl,
#                             from the k8s.io/kubernetes module (kubernetes/)
#   containerd $CONTAINERD_VERSION
#                             containerd, its runc shim and ctr, from the
#                             containerd/v2 module: a containerd of its own,
#                             never the machine's or Docker's, and 2.x for
#                             gVisor's shim (runsc-shim/)
#   gVisor's shim             containerd-shim-runsc-v1 (runsc-shim/), for
#                             the RuntimeClass "runsc"; runsc itself is
#                             deploy/runsc.sh's
#   CoreDNS                   with the plugins cluster DNS needs (coredns/)
#   kube-router $KUBE_ROUTER_VERSION
#                             its network-policy firewall alone: it enforces
#                             NetworkPolicy, which the bridge CNI does not
#   etcd                      Debian's etcd-server, extracted (installing it
#                             would start a system etcd)
#   pause                     the sandbox image, from C (pause/)
#
# Debian's runc, CNI plugins, ipset and nftables come from deploy/deps.sh.
#
# Usage: deploy/k8s-cluster/install.sh   (GO names the go command)
set -euo pipefail
. "$(dirname "$0")/lib.sh"
k8s_dirs
mkdir -p "$K8S_CACHE"
export CGO_ENABLED=0 GOFLAGS=-buildvcs=false
out=""
# A build that fails leaves nothing half made.
trap '[ -z "$out" ] || rm -rf "$out"' EXIT

# build DIR WHAT MINUTES CMD...: runs CMD with $out, a temporary folder,
# and makes it DIR when CMD succeeds, unless DIR is there already. The
# component's other versions go: the folders beside DIR named as DIR is
# up to its last "-".
build() {
  local dir=$1 what=$2 minutes=$3 old
  shift 3
  [ -f "$dir/.done" ] && return 0
  log "k8s-cluster: building $what into $dir ($minutes minutes on 2 cores)"
  out=$(mktemp -d "$K8S_CACHE/.build.XXXXXX")
  chmod 0755 "$out"
  local start=$SECONDS
  "$@"
  touch "$out/.done"
  rm -rf "$dir"
  mv "$out" "$dir"
  out=""
  local name=${dir##*/}
  if [[ $name == *-* ]]; then
    for old in "$K8S_CACHE/${name%-*}"-*; do
      [ "$old" = "$dir" ] || rm -rf "$old"
    done
  fi
  log "k8s-cluster: built $what in $((SECONDS - start)) s"
}

kubernetes() {
  local v=$K8S_VERSION minor
  minor=${v#v1.}
  minor=${minor%%.*}
  local x="-X k8s.io/component-base/version.gitVersion=$v -X k8s.io/component-base/version.gitMajor=1"
  x="$x -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean"
  x="$x -X k8s.io/client-go/pkg/version.gitVersion=$v -X k8s.io/client-go/pkg/version.gitMajor=1"
  x="$x -X k8s.io/client-go/pkg/version.gitMinor=$minor"
  (cd "$K8S_HERE/kubernetes" && $GO build -trimpath -ldflags "-s -w $x" -o "$out/" tool)
}

containerd() {
  GOBIN=$out $GO install -trimpath \
    -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION" \
    "github.com/containerd/containerd/v2/cmd/containerd@$CONTAINERD_VERSION" \
    "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION" \
    "github.com/containerd/containerd/v2/cmd/ctr@$CONTAINERD_VERSION"
}

runsc_shim() {
  (cd "$K8S_HERE/runsc-shim" && $GO build -trimpath -ldflags "-s -w" -o "$out/containerd-shim-runsc-v1" .)
}

coredns() {
  (cd "$K8S_HERE/coredns" && $GO build -trimpath -ldflags "-s -w" -o "$out/coredns" .)
}

kube_router() {
  GOBIN=$out $GO install -trimpath -ldflags "-s -w" \
    "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router@$KUBE_ROUTER_VERSION"
}

etcd() {
  # One apt at a time on the machine (deploy/lib.sh's apt_install).
  flock /run/lock/runbox-apt.lock sh -c \
    'apt-cache show etcd-server >/dev/null 2>&1 || apt-get update -qq'
  # As root, apt-get download warns that its _apt user cannot write here.
  (cd "$out" && apt-get download -q etcd-server 2>&1 >/dev/null | grep -v "unsandboxed as root" >&2 || true)
  dpkg -x "$out"/etcd-server_*.deb "$out/pkg"
  mv "$out/pkg/usr/bin/etcd" "$out/etcd"
  basename "$out"/etcd-server_*.deb > "$out/version"
  rm -rf "$out/pkg" "$out"/*.deb
}

pause() {
  "$K8S_HERE/pause/image.sh" "$out/pause.tar" "$PAUSE_IMAGE"
}

build "$PAUSE_DIR" "the pause image" "<1" pause
build "$ETCD_DIR" "etcd (Debian's etcd-server)" "<1" etcd
build "$KUBERNETES_DIR" "Kubernetes $K8S_VERSION" "5 to 30" kubernetes
build "$CONTAINERD_DIR" "containerd $CONTAINERD_VERSION" "2 to 7" containerd
build "$RUNSC_SHIM_DIR" "gVisor's containerd shim" "1 to 2" runsc_shim
build "$COREDNS_DIR" "CoreDNS" "1 to 3" coredns
build "$KUBE_ROUTER_DIR" "kube-router $KUBE_ROUTER_VERSION" "2 to 8" kube_router
