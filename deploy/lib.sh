# Sourced by deploy/deps.sh and deploy/runsc.sh.

# root_or_sudo sets $sudo to what runs a command as root here ("" as root,
# "sudo" where it needs no password), or stops with $1, the message saying
# what to run instead.
root_or_sudo() {
  if [ "$(id -u)" = 0 ]; then
    sudo=""
  elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    sudo="sudo"
  else
    echo "$1" >&2
    exit 1
  fi
}

# apt_install installs Debian packages, named in $1 (space first), as root,
# one install at a time: .ci/run prepares the test tools and the images at
# once, and apt refuses a second apt-get rather than waiting for the first.
apt_install() {
  $sudo flock /run/lock/runbox-apt.lock sh -c \
    "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends$1" >/dev/null
}
