#!/usr/bin/env bash
# CRIU 4.1.1 for the criu backend's tests, built once per machine and cached.
#
# Debian bookworm's criu 3.17 fails on kernels >= 6.13 ("vdso: Unexpected rt vDSO area
# bounds"). CRIU 4.1.1 from Debian trixie's source tarball builds on bookworm in ~3-4 min on
# 2 cores, with one patch: kernels >= 6.16 refuse SO_PASSCRED/SO_PASSSEC on inet sockets
# (upstream criu issues #2705/#2718), which 4.1.1 still reads on every socket it dumps.
#
# Usage: tests/criu/criu.sh               -> prints the path of the binary (builds it if needed)
#        JUPYTER_PAUSE_CACHE_ONLY=1 ...   -> prints it only when cached, else exits 3 (no build)
set -euo pipefail

VERSION=4.1.1-1
HERE=$(cd "$(dirname "$0")" && pwd)
PATCH=$HERE/criu-4.1.1-linux-6.16-sockopts.patch
CACHE=${JUPYTER_PAUSE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/jupyter-pause}
# The patch is part of the key: a changed patch rebuilds.
BIN=$CACHE/criu-$VERSION-$(sha256sum "$PATCH" | cut -c1-12)
# Runtime libraries of the binary (protobuf-c, libnl, libnet, nftables, ...) must be there too.
runs() { "$1" --version >/dev/null 2>&1; }
if [ -x "$BIN" ] && runs "$BIN"; then
    echo "$BIN"
    exit 0
fi
[ -n "${JUPYTER_PAUSE_CACHE_ONLY:-}" ] && exit 3

# The system's apt, one caller at a time: .ci/run runs this build beside the others (an apt
# already running would make this one fail on its lock, not wait).
apt_get() { flock /tmp/jupyter-pause-apt.lock apt-get "$@"; }
apt_install() {
    DEBIAN_FRONTEND=noninteractive apt_get install -y -qq --no-install-recommends "$@" >&2
}
# Only the source of trixie's criu is used: a deb-src line alone never upgrades a package.
SOURCES=/etc/apt/sources.list.d/jupyter-pause-trixie-src.sources
if [ ! -f "$SOURCES" ]; then
    printf 'Types: deb-src\nURIs: http://deb.debian.org/debian\nSuites: trixie\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' >"$SOURCES"
    apt_get update -qq >&2
fi
apt_install libprotobuf-dev libprotobuf-c-dev protobuf-c-compiler protobuf-compiler \
    python3-protobuf pkg-config libnl-3-dev libnl-route-3-dev libnet1-dev libcap-dev libbsd-dev \
    libnftables-dev libgnutls28-dev uuid-dev libaio-dev nftables dpkg-dev make gcc patch xz-utils
[ -x "$BIN" ] && runs "$BIN" && { echo "$BIN"; exit 0; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/criu-build.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
apt_get source -qq --tar-only "criu=$VERSION" >&2
tar xf criu_4.1.1.orig.tar.xz
cd criu-4.1.1
patch -p1 <"$PATCH" >&2
make -j"$(nproc)" criu >&2
mkdir -p "$CACHE"
cp criu/criu "$BIN.tmp"
mv "$BIN.tmp" "$BIN"
echo "$BIN"
