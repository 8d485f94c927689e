#!/bin/sh
# Builds Gitea (the forge the git-export tests run against) from its Go
# module into $(go env GOPATH)/bin/gitea, unless that binary is already
# this version. SQLite needs cgo; the build takes 5 to 12 minutes on two
# cores (5.4 min of CPU), so it is skipped whenever it can be.
#
# Usage: deploy/gitea/install.sh
set -eu
GO=${GO:-go}
version=1.26.0
dir=$(cd "$(dirname "$0")" && pwd)
bin="$($GO env GOPATH)/bin/gitea"

if [ -x "$bin" ] && "$bin" --version 2>/dev/null | grep -q "version $version "; then
  exit 0
fi
command -v gcc >/dev/null || { echo "gitea: a C compiler is needed (SQLite uses cgo): apt-get install gcc" >&2; exit 1; }
echo "gitea: building Gitea $version into $bin (5 to 12 minutes on 2 cores)" >&2
mkdir -p "$(dirname "$bin")"
cd "$dir"
tags="sqlite sqlite_unlock_notify"
CGO_ENABLED=1 $GO build -trimpath -buildvcs=false -tags "$tags" \
  -ldflags "-s -w -X 'main.Version=$version' -X 'main.Tags=$tags'" \
  -o "$bin.tmp" code.gitea.io/gitea
mv "$bin.tmp" "$bin"
