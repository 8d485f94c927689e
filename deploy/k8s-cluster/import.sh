#!/bin/bash
# Imports Docker images into the test cluster running in DIR (up.sh), as
# the kubelet then finds them: `docker save | ctr images import`. An image
# the cluster has already, as the same build, is not imported again; with
# K8S_KEEP_IMAGES=1 that holds from one cluster to the next. Pods name the
# images as Docker does (runner-python:latest) with imagePullPolicy Never.
#
# Usage: import.sh DIR IMAGE...
set -euo pipefail
. "$(dirname "$0")/lib.sh"
[ $# -ge 2 ] || die "usage: $0 DIR IMAGE..."
dir=$(cd "$1" && pwd)
shift
[ -f "$dir/cluster.env" ] || die "k8s-cluster: no cluster runs in $dir"
# shellcheck disable=SC1091
. "$dir/cluster.env"
ctr() { "$K8S_CTR" -a "$K8S_CONTAINERD" -n k8s.io "$@"; }
mkdir -p "$K8S_IMAGES/runbox-imported"
for image in "$@"; do
  id=$(docker image inspect -f '{{.Id}}' "$image") || die "k8s-cluster: no Docker image $image"
  # The name containerd gives it: Docker Hub's, as Docker reads a short name.
  ref=$image
  [[ $ref == *:* || $ref == *@* ]] || ref=$ref:latest
  first=${ref%%/*}
  if [[ $ref != */* ]]; then
    ref=docker.io/library/$ref
  elif [[ $first != *.* && $first != *:* && $first != localhost ]]; then
    ref=docker.io/$ref
  fi
  marker=$K8S_IMAGES/runbox-imported/$(tr '/:@' '___' <<<"$ref")
  if [ "$(cat "$marker" 2>/dev/null)" = "$id" ] && ctr images ls -q | grep -qxF "$ref"; then
    continue
  fi
  start=$SECONDS
  # What ctr says only on failure: it warns on every call that
  # containerd's cgroup v1 support goes in 2029.
  if ! docker save "$image" | ctr images import --snapshotter overlayfs - > /dev/null 2> "$dir/import.err"; then
    grep -v DEPRECATION "$dir/import.err" >&2
    die "k8s-cluster: the import of $image failed"
  fi
  echo "$id" > "$marker"
  log "k8s-cluster: imported $image in $((SECONDS - start)) s"
done
