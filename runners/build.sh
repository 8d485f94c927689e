#!/bin/sh
# Builds the runner images that are missing or out of date, without a
# container registry: when debian:bookworm-slim can be neither found nor
# pulled, it is made from Debian's packages with debootstrap.
#
# Usage: runners/build.sh [language...]   (default: every runners/*/Dockerfile)
# RUNNER_TAG (default latest) tags the images runner-<language>:<tag>; an
# executor with the same RUNNER_TAG prefers them.
set -eu
cd "$(dirname "$0")"
. ./lib.sh

base=debian:bookworm-slim
if ! docker image inspect "$base" >/dev/null 2>&1; then
  if ! timeout 60 docker pull -q "$base" >/dev/null 2>&1; then
    echo "runners: $base not available; building it with debootstrap" >&2
    command -v debootstrap >/dev/null || { echo "runners: debootstrap is not installed (apt-get install debootstrap)" >&2; exit 1; }
    root=$(mktemp -d)
    trap 'rm -rf "$root"' EXIT
    debootstrap --variant=minbase bookworm "$root" http://deb.debian.org/debian >/dev/null
    tar -C "$root" -c . | docker import -c 'CMD ["bash"]' - "$base" >/dev/null
    rm -rf "$root"
    trap - EXIT
  fi
fi

# The agent is the same static binary in every image; -trimpath and an empty
# build ID keep it byte-identical across builds, so the hash below is stable.
mkdir -p build
(cd .. && CGO_ENABLED=0 go build -trimpath -ldflags='-s -w -buildid=' -o runners/build/runbox-agent ./cmd/runbox-agent)

langs=${*:-$(for d in */Dockerfile; do dirname "$d"; done)}
for lang in $langs; do
  image=runner-$lang:${RUNNER_TAG:-latest}
  # Project templates (template-*) share template-lib.
  deps=$lang
  case $lang in template-*) deps="$lang template-lib" ;; esac
  hash=$(find $deps -type f -not -path '*/__pycache__/*' | LC_ALL=C sort | xargs cat build/runbox-agent | sha256sum | cut -c1-16)
  build_image "$image" "$hash" "$lang/Dockerfile"
done
# Earlier builds of the runners, now untagged.
docker image prune -f --filter label=sandbox.runner=true >/dev/null
