#!/bin/sh
# Installs gVisor's runsc (Debian's package) and registers it with the
# local Docker Engine as the runtime "runsc", so that sandboxes can run
# under gVisor (SANDBOX_RUNTIME=runsc). Idempotent: it does nothing when
# the runtime is registered already with what runbox needs.
#
# The runtime is merged into /etc/docker/daemon.json (what is there is
# kept) and the daemon is told to reload it with SIGHUP: Docker reloads
# its runtimes without a restart, so running containers are not touched.
#
#   --platform=ptrace  works without KVM and inside a virtual machine
#   --network=none     sandboxes have no network anyway: gVisor's netstack
#                      is not even started
#   --host-uds=open    a sandbox may connect to the host's Unix sockets it
#                      is given: the executor's egress proxy socket, the
#                      only one a sandbox mounts (SECURITY.md); without it
#                      egress takes the slower way through the agent
#
# A runsc registered already keeps its arguments; --host-uds=open is added
# where it lacks one.
set -eu

conf=/etc/docker/daemon.json
args='["--platform=ptrace","--network=none","--host-uds=open"]'

registered() {
  docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q '"runsc"'
}

# has_uds: the registration in $conf sets --host-uds already.
has_uds() {
  [ -s "$conf" ] && command -v jq >/dev/null &&
    jq -e '[.runtimes.runsc.runtimeArgs // [] | .[] | select(startswith("--host-uds"))] | length > 0' "$conf" >/dev/null 2>&1
}

if registered && has_uds; then
  exit 0
fi

. "$(dirname "$0")/lib.sh"
if registered; then
  # Works as it is; only egress is slower without the argument.
  if ! (root_or_sudo "") >/dev/null 2>&1; then
    echo "runsc: registered without --host-uds=open, and adding it needs root (sudo $0): egress under gVisor takes the slower way" >&2
    exit 0
  fi
fi
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
if printf '%s' "$current" | jq -e '.runtimes.runsc' >/dev/null 2>&1; then
  # Registered (in the file, or not loaded yet): add the one argument.
  merged=$(printf '%s' "$current" | jq '.runtimes.runsc.runtimeArgs = ((.runtimes.runsc.runtimeArgs // [])
    | map(select(startswith("--host-uds") | not)) + ["--host-uds=open"])')
else
  merged=$(printf '%s' "$current" | jq --arg path "$path" --argjson args "$args" \
    '.runtimes = ((.runtimes // {}) + {runsc: {path: $path, runtimeArgs: $args}})')
fi
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
  registered && { echo "runsc: registered with Docker" >&2; exit 0; }
  sleep 0.5
done
echo "runsc: Docker did not load the runtime from $conf (see its log)" >&2
exit 1
