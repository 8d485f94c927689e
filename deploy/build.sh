#!/bin/sh
# Builds what docker-compose.yml runs: the runner images (runners/build.sh),
# runbox:<tag> (api and executor) and runbox-redis:<tag>. An image is
# rebuilt only when the hash of what goes into it changed, so a second run
# costs a Go build and nothing else.
#
# Usage: deploy/build.sh   (RUNBOX_TAG, default latest, tags the images)
set -eu
cd "$(dirname "$0")"
../runners/build.sh
. ../runners/lib.sh

mkdir -p build
# -trimpath and an empty build ID keep the binaries byte-identical across
# builds of the same source, so the hash below is stable.
for cmd in api executor; do
  (cd .. && CGO_ENABLED=0 go build -trimpath -ldflags='-s -w -buildid=' -o deploy/build/$cmd ./cmd/$cmd)
done

tag=${RUNBOX_TAG:-latest}
for spec in runbox:runbox.Dockerfile:build/api:build/executor runbox-redis:redis.Dockerfile; do
  name=${spec%%:*}
  rest=${spec#*:}
  file=${rest%%:*}
  inputs=$(echo "$rest" | tr ':' ' ')
  image=$name:$tag
  hash=$(cat $inputs | sha256sum | cut -c1-16)
  build_image "$image" "$hash" "$file"
done
