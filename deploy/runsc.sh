#!/bin/sh
# Installs gVisor's runsc (Debian's package) and registers it with the
# local Docker Engine as the runtime "runsc", so that sandboxes can run
# under gVisor (SANDBOX_RUNTIME=runsc). Idempotent: it does nothing when
# the runtime is registered already.
#
# The runtime is merged into /etc/docker/daemon.json (what is there is
# kept) and the daemon is told to reload it with SIGHUP: Docker reloads
# its runtimes without a restart, so running containers are not touched.
#
#   --platform=ptrace  works without KVM and inside a virtual machine
#   --network=none     sandboxes have no network anyway: gVisor's netstack
#                      is not even started
set -eu

conf=/etc/docker/daemon.json
args='["--platform=ptrace","--network=none"]'

if docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q '"runsc"'; then
  exit 0
fi

. "$(dirname "$0")/lib.sh"
root_or_sudo "runsc: registering gVisor needs root: sudo $0"

need=""
command -v runsc >/dev/null || need="$need runsc"
command -v jq >/dev/null || need="$need jq"
if [ -n "$need" ]; then
  echo "runsc: installing$need" >&2
  apt_install "$need"
fi
path=$(command -v runsc)

current='{}'
[ -s "$conf" ] && current=$($sudo cat "$conf")
merged=$(printf '%s' "$current" | jq --arg path "$path" --argjson args "$args" \
  '.runtimes = ((.runtimes // {}) + {runsc: {path: $path, runtimeArgs: $args}})')
tmp=$(mktemp)
printf '%s\n' "$merged" > "$tmp"
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
  docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q '"runsc"' && { echo "runsc: registered with Docker" >&2; exit 0; }
  sleep 0.5
done
echo "runsc: Docker did not load the runtime from $conf (see its log)" >&2
exit 1
