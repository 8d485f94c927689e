#!/bin/bash
# Builds the pause image: a static pause (pause.c) alone in one layer,
# written as `docker save` writes an image, which `ctr images import`
# reads. Usage: image.sh OUT.tar REF
set -euo pipefail
out=$1 ref=$2
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
gcc -static -O2 -s -o pause "$here/pause.c"
tar --owner=0 --group=0 --numeric-owner --mtime=@0 --mode=0755 -cf layer.tar pause
diff=$(sha256sum layer.tar | cut -d' ' -f1)
printf '{"architecture":"amd64","os":"linux","config":{"Entrypoint":["/pause"],"User":"65535:65535"},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
  "$diff" > config.json
config=$(sha256sum config.json | cut -d' ' -f1)
mv config.json "$config.json"
printf '[{"Config":"%s.json","RepoTags":["%s"],"Layers":["layer.tar"]}]' "$config" "$ref" > manifest.json
tar --owner=0 --group=0 --numeric-owner --mtime=@0 -cf "$out" "$config.json" layer.tar manifest.json
