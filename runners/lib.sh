# Sourced by runners/build.sh and deploy/build.sh.

# hash_files PATH...: a short hash of the files under the paths and of
# what comes on stdin.
hash_files() {
  { find "$@" -type f -not -path '*/__pycache__/*' | LC_ALL=C sort | xargs cat; cat; } | sha256sum | cut -c1-16
}

# build_image IMAGE HASH DOCKERFILE [BUILD-ARG...]: builds IMAGE from
# DOCKERFILE (the context is the current folder) unless it already carries
# the label runbox.hash=HASH, so that an image is rebuilt only when what
# goes into it changed. The build's output is shown only when it fails.
# An image that writes /opt/runbox/version (its language's version, found
# at build time) is labelled sandbox.version with it; runbox.hash is set
# last, so that an image whose build or label failed is built again.
build_image() {
  image=$1 hash=$2 file=$3
  shift 3
  have=$(docker image inspect -f '{{index .Config.Labels "runbox.hash"}}' "$image" 2>/dev/null || true)
  [ "$have" = "$hash" ] && return 0
  echo "building $image" >&2
  log=$(mktemp)
  args=""
  for a in "$@"; do args="$args --build-arg $a"; done
  # shellcheck disable=SC2086 # args are words
  if ! docker build -q $args -t "$image" -f "$file" . >"$log" 2>&1; then
    cat "$log" >&2
    rm -f "$log"
    return 1
  fi
  version=$(docker run --rm --network none --entrypoint cat "$image" /opt/runbox/version 2>/dev/null || true)
  label="runbox.hash=\"$hash\""
  [ -n "$version" ] && label="$label sandbox.version=\"$version\""
  if ! printf 'FROM %s\nLABEL %s\n' "$image" "$label" | docker build -q -t "$image" - >"$log" 2>&1; then
    cat "$log" >&2
    rm -f "$log"
    return 1
  fi
  rm -f "$log"
}
