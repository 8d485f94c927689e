#!/bin/sh
# Builds the images runbox is deployed from: the runner images
# (runners/build.sh), runbox:<tag> (api and executor) and runbox-redis:<tag>
# — what docker-compose.yml runs — and, with the argument kubernetes, also
# runbox-versitygw:<tag>, the S3 server deploy/kubernetes keeps the
# conversations' files in. An image is rebuilt only when the hash of what
# goes into it changed, so a second run costs a Go build and nothing else.
#
# Usage: deploy/build.sh [compose|kubernetes]   (RUNBOX_TAG, default
# latest, tags the images)
set -eu
cd "$(dirname "$0")"
target=${1:-compose}
case $target in
compose | kubernetes) ;;
*)
  echo "usage: $0 [compose|kubernetes]" >&2
  exit 2
  ;;
esac
../runners/build.sh
. ../runners/lib.sh

mkdir -p build
# -trimpath and an empty build ID keep the binaries byte-identical across
# builds of the same source, so the hash below is stable.
for cmd in api executor; do
  (cd .. && CGO_ENABLED=0 go build -trimpath -ldflags='-s -w -buildid=' -o deploy/build/$cmd ./cmd/$cmd)
done
# The runner images' list, for executors on Kubernetes (SANDBOX_RUNNERS_FILE):
# the runbox image and the runners are built together, so it names them.
./runners-list.sh "${RUNNER_TAG:-latest}" > build/runners.json
specs="runbox:runbox.Dockerfile:build/api:build/executor:build/runners.json runbox-redis:redis.Dockerfile"

if [ "$target" = kubernetes ]; then
  gw=$(command -v versitygw || echo "$(go env GOPATH)/bin/versitygw")
  if [ ! -x "$gw" ]; then
    echo "deploy/build.sh: versitygw is not installed: make test-deps, or go install github.com/versity/versitygw/cmd/versitygw@v1.8.0" >&2
    exit 1
  fi
  cp "$gw" build/versitygw
  specs="$specs runbox-versitygw:versitygw.Dockerfile:build/versitygw"
fi

tag=${RUNBOX_TAG:-latest}
for spec in $specs; do
  name=${spec%%:*}
  rest=${spec#*:}
  file=${rest%%:*}
  inputs=$(echo "$rest" | tr ':' ' ')
  image=$name:$tag
  hash=$(cat $inputs | sha256sum | cut -c1-16)
  build_image "$image" "$hash" "$file"
done
# versitygw is the host's build, with cgo: it runs on the image's Debian
# only if the host's C library is no newer. Better said here than by a
# pod that does not start.
if [ "$target" = kubernetes ] && ! docker run --rm --network none "runbox-versitygw:$tag" --version >/dev/null 2>&1; then
  echo "deploy/build.sh: versitygw does not run in runbox-versitygw (built against a newer C library than Debian bookworm's?): install it with CGO_ENABLED=0" >&2
  exit 1
fi
