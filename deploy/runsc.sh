#!/bin/sh
# Builds gVisor's runsc from its Go module and registers it with the local
# Docker Engine as the runtime "runsc", so that sandboxes can run under
# gVisor (SANDBOX_RUNTIME=runsc). Idempotent: it does nothing when that
# build is registered already with what runbox needs.
#
# Why a build and not Debian's package: Debian's runsc dates from 2022-12
# — four years of gVisor's security fixes behind — and has only the ptrace
# platform, under which a system call costs ~50 µs and a fork ~17 ms here;
# systrap, gVisor's platform since 2023, works without KVM and inside a
# virtual machine at a fraction of that (docs/performance.md). The build is
# static (CGO_ENABLED=0): runsc re-executes itself inside its chroot, where
# no dynamic loader is.
#
# The runtime is merged into /etc/docker/daemon.json (what else is there
# is kept) and the daemon is told to reload it with SIGHUP: Docker reloads
# its runtimes without a restart, so running containers are not touched.
#
#   --platform=systrap  (ptrace where systrap does not start)
#   --network=none      sandboxes have no network anyway: gVisor's netstack
#                       is not even started
#   --host-uds=open     a sandbox may connect to the host's Unix sockets it
#                       is given: the executor's egress proxy socket, the
#                       only one a sandbox mounts (SECURITY.md)
#   --systrap-disable-fast-path
#                       on a host of 2 CPUs or fewer: systrap's fast path
#                       spins a CPU while it waits for the sandbox's next
#                       system call, a CPU the api, the executor and Redis
#                       need here; without it a warm run took ~1 ms less
#                       and a sandbox 10 % less CPU a run (docs/performance.md)
#
# It also lets gVisor back sandboxes' memory with huge pages
# (deploy/hugepages.sh; RUNSC_HOST_THP=keep leaves the host as it is).
#
# Usage: deploy/runsc.sh   (GO names the go command; go by default)
set -eu
GO=${GO:-go}
# gVisor's "go" branch (its tree with the generated Go files), 2026-09-05.
version=v0.0.0-20260905035102-160fafc42237
conf=/etc/docker/daemon.json
bin="$($GO env GOPATH)/bin/runsc"

. "$(dirname "$0")/lib.sh"

if ! { [ -x "$bin" ] && "$bin" --version 2>/dev/null | grep -q "version $version"; }; then
  echo "runsc: building gVisor $version into $bin (2 to 5 minutes on 2 cores)" >&2
  mkdir -p "$(dirname "$bin")"
  out=$(mktemp -d)
  CGO_ENABLED=0 GOBIN="$out" $GO install -trimpath \
    -ldflags "-s -w -X gvisor.dev/gvisor/runsc/version.version=$version" "gvisor.dev/gvisor/runsc@$version"
  mv "$out/runsc" "$bin"
  rmdir "$out"
fi

# args: the runtime's arguments besides its platform.
args='["--network=none", "--host-uds=open"]'
if [ "$(nproc)" -le 2 ]; then
  args='["--network=none", "--host-uds=open", "--systrap-disable-fast-path"]'
fi

# wanted: the registration for the platform $1.
wanted() {
  jq -n --arg path "$bin" --arg platform "$1" --argjson args "$args" \
    '{path: $path, runtimeArgs: (["--platform=" + $platform] + $args)}'
}

# registered: Docker runs this build as "runsc" with these arguments (any
# platform of ours).
registered() {
  docker info --format '{{json .Runtimes}}' 2>/dev/null |
    jq -e --arg path "$bin" --argjson args "$args" \
      '.runsc.path == $path and ([.runsc.runtimeArgs[] | select(startswith("--platform=") | not)] == $args)' >/dev/null 2>&1
}

need=""
command -v jq >/dev/null || need="$need jq"
if [ -n "$need" ]; then
  root_or_sudo "runsc: jq is needed: sudo apt-get install$need"
  echo "runsc: installing$need" >&2
  apt_install "$need"
fi
[ "${RUNSC_HOST_THP:-}" = keep ] || "$(dirname "$0")/hugepages.sh"

if registered; then
  exit 0
fi
root_or_sudo "runsc: registering gVisor needs root: sudo $0"

# systrap where it starts here, else ptrace.
platform=systrap
if ! $sudo "$bin" --platform=systrap --network=none do /bin/true >/dev/null 2>&1; then
  echo "runsc: the systrap platform does not start here; registering ptrace (slower)" >&2
  platform=ptrace
fi

current='{}'
[ -s "$conf" ] && current=$($sudo cat "$conf")
tmp=$(mktemp)
printf '%s' "$current" | jq --argjson rt "$(wanted $platform)" '.runtimes = ((.runtimes // {}) + {runsc: $rt})' > "$tmp"
$sudo mkdir -p "$(dirname "$conf")"
$sudo cp "$tmp" "$conf"
rm -f "$tmp"

pid=$(pidof dockerd || true)
if [ -z "$pid" ]; then
  echo "runsc: registered in $conf; start the Docker Engine to use it" >&2
  exit 0
fi
$sudo kill -HUP $pid
for _ in $(seq 20); do
  registered && { echo "runsc: registered with Docker ($platform)" >&2; exit 0; }
  sleep 0.5
done
echo "runsc: Docker did not load the runtime from $conf (see its log)" >&2
exit 1
