#!/bin/sh
# Installs what `make run` and `make test` need and a fresh Debian or
# Ubuntu machine lacks, through apt when it can (as root, or with sudo);
# otherwise it stops with the exact command to run.
#
# Usage: deploy/deps.sh [run|test]   (test also needs chromium, compose,
# gcc and git for Gitea, and what the test cluster runs with)
#
# gVisor (runsc) is built from its Go module and registered with Docker
# (deploy/runsc.sh) for the tests, which run sandboxes under it too, and
# for `run` when SANDBOX_RUNTIME=runsc asks for it.
set -eu
cd "$(dirname "$0")"
if [ "${1:-run}" = test ] || [ "${SANDBOX_RUNTIME:-}" = runsc ]; then
  ./runsc.sh
fi

need=""
command -v docker >/dev/null || { echo "deps: Docker Engine is not installed: see https://docs.docker.com/engine/install/" >&2; exit 1; }
command -v debootstrap >/dev/null || need="$need debootstrap"
if [ "${1:-run}" = test ]; then
  command -v redis-server >/dev/null || need="$need redis-server"
  command -v chromium >/dev/null || command -v chromium-browser >/dev/null || need="$need chromium"
  docker compose version >/dev/null 2>&1 || command -v docker-compose >/dev/null || need="$need docker-compose"
  # Gitea (deploy/gitea) is built with SQLite, which needs cgo.
  command -v gcc >/dev/null || need="$need gcc libc6-dev"
  command -v git >/dev/null || need="$need git"
  # An XFS image, where forks are reflinks (internal/files TestForkReflinks).
  command -v mkfs.xfs >/dev/null || need="$need xfsprogs"
  # The single-node Kubernetes the tests run against (deploy/k8s-cluster):
  # runc and the CNI plugins it runs pods with, what kube-proxy and
  # kube-router write the firewall with, what makes its certificates.
  command -v runc >/dev/null || need="$need runc"
  [ -x /usr/lib/cni/bridge ] || need="$need containernetworking-plugins"
  command -v ipset >/dev/null || need="$need ipset"
  command -v nft >/dev/null || need="$need nftables"
  command -v iptables >/dev/null || need="$need iptables"
  command -v openssl >/dev/null || need="$need openssl"
  command -v curl >/dev/null || need="$need curl"
fi
[ -z "$need" ] && exit 0

. ./lib.sh
root_or_sudo "deps: missing$need; install them with: sudo apt-get install$need"
echo "deps: installing$need" >&2
apt_install "$need"
