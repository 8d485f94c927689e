#!/bin/sh
# Builds the runner images that are missing or out of date, without a
# container registry: when debian:bookworm-slim can be neither found nor
# pulled, it is made from Debian's packages with debootstrap.
#
# Usage: runners/build.sh [language...]   or   RUNNERS=python,r runners/build.sh
# (default: every runners/<language>/Dockerfile). RUNNER_TAG (default latest)
# tags the images runner-<language>:<tag>; an executor with the same
# RUNNER_TAG prefers them. A new RUNNER_EPOCH (default 0; e.g. the date)
# rebuilds every image without the build cache, with Debian's packages of
# the day (security updates).
#
# Every image starts FROM runner-base:<tag> (base/Dockerfile: the user, the
# folders). Images are built RUNNER_JOBS (default 3) at a time; languages
# whose first package layer is the same (c, cpp and rust install gcc, g++
# and libc6-dev first) build one after another, so that the later ones
# find that layer in the cache and share it.
set -eu
cd "$(dirname "$0")"
. ./lib.sh
tag=${RUNNER_TAG:-latest}

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

# The agent, and the E2B sandbox daemon in runner-base, are the same static
# binaries in every image; -trimpath and an empty build ID keep them
# byte-identical across builds, so the hashes below are stable.
mkdir -p build
(cd .. && CGO_ENABLED=0 go build -trimpath -ldflags='-s -w -buildid=' -o runners/build/runbox-agent ./cmd/runbox-agent)
(cd .. && CGO_ENABLED=0 go build -trimpath -ldflags='-s -w -buildid=' -o runners/build/runbox-envd ./cmd/runbox-envd)

base_hash=$(echo "${RUNNER_EPOCH:-0}" | hash_files base build/runbox-envd)
build_image "runner-base:$tag" "$base_hash" base/Dockerfile "EPOCH=${RUNNER_EPOCH:-0}"

langs=${*:-$(echo "${RUNNERS:-}" | tr ',' ' ')}
[ -n "$langs" ] || langs=$(for d in */Dockerfile; do dirname "$d"; done | grep -vx base)
for lang in $langs; do
  [ "$lang" != base ] && [ -f "$lang/Dockerfile" ] || { echo "runners: no runner $lang" >&2; exit 2; }
done

# One line per chain of languages built in order; chains build in
# parallel, the longest first (GCC's chain, then Python's data stack,
# which runner-shell starts with too).
chains=$(for lang in $langs; do echo "$lang"; done | awk '
  /^(c|cpp|rust)$/ { gcc = gcc " " $0; next } /^(python|shell)$/ { py = py " " $0; next } { rest = rest $0 "\n" }
  END { if (gcc != "") print gcc; if (py != "") print py; printf "%s", rest }')
export tag base_hash
echo "$chains" | xargs -P "${RUNNER_JOBS:-3}" -I{} sh -c '
  . ./lib.sh
  for lang in {}; do
    # Project templates (template-*) share template-lib.
    deps=$lang
    case $lang in template-*) deps="$lang template-lib" ;; esac
    hash=$(echo "$base_hash" | hash_files build/runbox-agent $deps)
    build_image "runner-$lang:$tag" "$hash" "$lang/Dockerfile" "BASE=runner-base:$tag" || exit 1
  done'
# Earlier builds of the runners, now untagged.
docker image prune -f --filter label=sandbox.runner=true >/dev/null
