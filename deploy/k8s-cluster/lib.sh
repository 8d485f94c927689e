# Sourced by the scripts beside it: what the test cluster is built from,
# where the builds are cached, and small helpers.
#
# Every component is built (or extracted) once into a folder of its own
# under $K8S_CACHE named <component>-<version, or a digest of the files
# that define the build>: install.sh finds the folder and does nothing,
# and a change builds into a new folder (and removes the old).

K8S_VERSION=v1.34.4
CONTAINERD_VERSION=v2.2.9
KUBE_ROUTER_VERSION=v2.1.0
# The sandbox ("pause") image the kubelet asks for; built here from C.
PAUSE_IMAGE=registry.k8s.io/pause:3.10

K8S_HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
K8S_CACHE=${RUNBOX_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/runbox}/k8s-cluster
GO=${GO:-go}

# digest prints a short digest of the files named (the inputs of a build).
digest() { cat "$@" | sha256sum | cut -c1-10; }

# Where each component lives once built.
k8s_dirs() {
  KUBERNETES_DIR=$K8S_CACHE/kubernetes-$(digest "$K8S_HERE"/kubernetes/go.mod "$K8S_HERE"/kubernetes/go.sum)
  CONTAINERD_DIR=$K8S_CACHE/containerd-$CONTAINERD_VERSION
  RUNSC_SHIM_DIR=$K8S_CACHE/runsc-shim-$(digest "$K8S_HERE"/runsc-shim/go.mod "$K8S_HERE"/runsc-shim/go.sum "$K8S_HERE"/runsc-shim/*.go)
  COREDNS_DIR=$K8S_CACHE/coredns-$(digest "$K8S_HERE"/coredns/go.mod "$K8S_HERE"/coredns/go.sum "$K8S_HERE"/coredns/*.go)
  KUBE_ROUTER_DIR=$K8S_CACHE/kube-router-$KUBE_ROUTER_VERSION
  ETCD_DIR=$K8S_CACHE/etcd
  PAUSE_DIR=$K8S_CACHE/pause-$(digest "$K8S_HERE"/pause/pause.c "$K8S_HERE"/pause/image.sh)
  # Images imported into the cluster's containerd, kept between clusters
  # (K8S_KEEP_IMAGES=1): importing a runner image takes most of a minute.
  IMAGES_DIR=$K8S_CACHE/images-$CONTAINERD_VERSION
}

# log prints a line on standard error, with the seconds since the script
# started.
log() { printf '[%5ss] %s\n' "$SECONDS" "$*" >&2; }
die() { log "$*"; exit 1; }
