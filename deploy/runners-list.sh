#!/bin/sh
# Writes the runner list (SANDBOX_RUNNERS_FILE, internal/sandbox/runnerlist)
# of the runner images of this Docker Engine tagged TAG: each image's
# reference and labels, as the Docker engine would find them. An executor
# on Kubernetes, which can ask no Docker Engine, offers what it lists.
# deploy/build.sh bakes it into the runbox image (/etc/runbox/runners.json).
#
# Usage: deploy/runners-list.sh [TAG] > runners.json   (default: latest;
# LANGUAGES="python bash" lists those runners alone, and templates only
# when named as template-<name>)
set -eu
tag=${1:-latest}
refs=$(docker image ls --filter label=sandbox.runner=true --format '{{.Repository}}:{{.Tag}}' |
  grep -E "^runner-[a-z0-9-]+:$tag\$" | LC_ALL=C sort -u)
if [ -n "${LANGUAGES:-}" ]; then
  want=$(for l in $LANGUAGES; do echo "runner-$l:$tag"; done)
  refs=$(echo "$refs" | grep -xF "$want" || true)
fi
printf '{"runners": ['
sep=""
for ref in $refs; do
  labels=$(docker image inspect --format '{{json .Config.Labels}}' "$ref")
  printf '%s\n  {"image": "%s", "labels": %s}' "$sep" "$ref" "$labels"
  sep=","
done
printf '\n]}\n'
