#!/usr/bin/env bash
# The real GKE Workspaces snapshot add-on (gke-workspace-snapshot-addon, source in gke-addon/,
# see gke-addon/SOURCE.md) for the cluster tests, built once per machine and cached.
#
# Offline, with nothing installed system-wide: Go 1.23 from bookworm-backports (bookworm's own Go
# 1.19 is too old for client-go 0.32) and the Go library sources from Debian trixie's
# golang-*-dev packages (arch: all, so they work on bookworm; bookworm has no client-go at all),
# both downloaded with a private apt configuration and extracted into a work folder; GOPATH mode
# (no go.mod, no module proxy). ~3 min on 2 cores the first time.
#
# Usage: tests/cluster/gke-addon.sh        -> prints the path of the binary (builds it if needed)
#        JUPYTER_PAUSE_CACHE_ONLY=1 ...    -> prints it only when cached, else exits 3 (no build)
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
SRC=$HERE/gke-addon
CACHE=${JUPYTER_PAUSE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/jupyter-pause}
# The source is part of the key: a changed file rebuilds.
KEY=$(cd "$SRC" && find cmd internal -name '*.go' | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-12)
BIN=$CACHE/gke-snapshot-addon-$KEY
if [ -x "$BIN" ]; then
    echo "$BIN"
    exit 0
fi
[ -n "${JUPYTER_PAUSE_CACHE_ONLY:-}" ] && exit 3

started=$(date +%s)
W=$(mktemp -d "${TMPDIR:-/tmp}/gke-addon-build.XXXXXX")
trap 'rm -rf "$W"' EXIT
mkdir -p "$W/apt/lists/partial" "$W/apt/cache/archives/partial" "$W/debs" "$W/root"
: >"$W/apt/status" # an empty dpkg status: apt resolves the whole closure, installs nothing
printf 'deb http://deb.debian.org/debian bookworm-backports main\ndeb http://deb.debian.org/debian trixie main\n' >"$W/apt/sources.list"
APT=(apt-get -o Dir::Etc::sourcelist="$W/apt/sources.list" -o Dir::Etc::sourceparts=-
    -o Dir::State::Lists="$W/apt/lists" -o Dir::Cache="$W/apt/cache"
    -o Dir::State::status="$W/apt/status" -o APT::Install-Recommends=0
    -o APT::Sandbox::User=root) # the downloads land in our private folder, which _apt cannot enter
"${APT[@]}" update -qq >&2
# The golang-*-dev source packages client-go needs, from trixie; the Go 1.24 toolchain they
# depend on is dropped (the build uses bookworm-backports' 1.23, which builds them as well).
CLOSURE=$("${APT[@]}" -t trixie install -s golang-k8s-client-go-dev | awk '/^Inst golang-/{print $2}' |
    grep -vxE 'golang-(1\.24-go|1\.24-src|src|go|any)')
(cd "$W/debs" && "${APT[@]}" -qq -t trixie download $CLOSURE >&2 &&
    "${APT[@]}" -qq download golang-1.23-go/bookworm-backports golang-1.23-src/bookworm-backports >&2)
for deb in "$W"/debs/*.deb; do dpkg-deb -x "$deb" "$W/root"; done
echo "gke-addon: Go and $(echo "$CLOSURE" | wc -l) library packages fetched in $(($(date +%s) - started)) s" >&2

export GOROOT=$W/root/usr/lib/go-1.23 PATH=$W/root/usr/lib/go-1.23/bin:$PATH
export GO111MODULE=off GOFLAGS= GOPROXY=off GOTOOLCHAIN=local CGO_ENABLED=0 GOCACHE=$W/gocache
mkdir -p "$W/gopath/src/github.com/kubeflow/notebooks/gke"
cp -r "$SRC/cmd" "$SRC/internal" "$W/gopath/src/github.com/kubeflow/notebooks/gke/"
compiling=$(date +%s)
GOPATH=$W/gopath:$W/root/usr/share/gocode go build -trimpath -ldflags '-s -w' \
    -o "$W/snapshot-addon" github.com/kubeflow/notebooks/gke/cmd/snapshot-addon >&2
echo "gke-addon: go build $(($(date +%s) - compiling)) s, $(($(date +%s) - started)) s in all" >&2
mkdir -p "$CACHE"
cp "$W/snapshot-addon" "$BIN.tmp"
mv "$BIN.tmp" "$BIN"
echo "$BIN"
