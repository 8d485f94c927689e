# Sourced by runners/build.sh and deploy/build.sh.

# build_image IMAGE HASH DOCKERFILE: builds IMAGE from DOCKERFILE (the
# context is the current folder) unless it already carries the label
# runbox.hash=HASH, so that an image is rebuilt only when what goes into it
# changed. The build's output is shown only when it fails.
build_image() {
  have=$(docker image inspect -f '{{index .Config.Labels "runbox.hash"}}' "$1" 2>/dev/null || true)
  [ "$have" = "$2" ] && return 0
  echo "building $1" >&2
  log=$(mktemp)
  if ! docker build -q --label "runbox.hash=$2" -t "$1" -f "$3" . >"$log" 2>&1; then
    cat "$log" >&2
    rm -f "$log"
    return 1
  fi
  rm -f "$log"
}
