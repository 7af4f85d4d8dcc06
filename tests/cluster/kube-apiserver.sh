#!/usr/bin/env bash
# A real kube-apiserver for the cluster backend's tests, built once per machine and cached.
#
# No ready kube-apiserver exists in Debian, PyPI or npm; Debian bookworm's `kubernetes` source
# package holds the full upstream v1.20.2 tree with vendor/, which Debian's Go 1.19 builds in
# GOPATH mode (after generating the OpenAPI file the tarball lacks, and with the vendored
# reflect2 1.0.1, which crashes under Go >= 1.18, replaced by Debian's 1.0.2). Also installs
# etcd-server, which the control plane needs. ~10-14 min on 2 cores the first time.
#
# Usage: tests/cluster/kube-apiserver.sh   -> prints the path of the binary (builds it if needed)
#        JUPYTER_PAUSE_CACHE_ONLY=1 ...      -> prints it only when cached, else exits 3 (no build)
set -euo pipefail

VERSION=1.20.5+really1.20.2-1.1+deb12u1
CACHE=${JUPYTER_PAUSE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/jupyter-pause}
BIN=$CACHE/kube-apiserver-$VERSION
if [ -x "$BIN" ] && command -v etcd >/dev/null; then
    echo "$BIN"
    exit 0
fi
[ -n "${JUPYTER_PAUSE_CACHE_ONLY:-}" ] && exit 3

apt_install() {
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >&2
}
SOURCES=/etc/apt/sources.list.d/jupyter-pause-deb-src.sources
if [ ! -f "$SOURCES" ]; then
    printf 'Types: deb-src\nURIs: http://deb.debian.org/debian\nSuites: bookworm bookworm-updates\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\nTypes: deb-src\nURIs: http://deb.debian.org/debian-security\nSuites: bookworm-security\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' >"$SOURCES"
    apt-get update -qq >&2
fi
command -v etcd >/dev/null || apt_install etcd-server
[ -x "$BIN" ] && { echo "$BIN"; exit 0; }
apt_install golang-go golang-github-modern-go-reflect2-dev dpkg-dev

GP=$(mktemp -d "${TMPDIR:-/tmp}/kube-apiserver-build.XXXXXX")
trap 'rm -rf "$GP"' EXIT
mkdir -p "$GP/src/k8s.io"
(cd "$GP/src/k8s.io" && apt-get source -qq "kubernetes=$VERSION" >&2 && mv kubernetes-1.20.5+really1.20.2 kubernetes)
cd "$GP/src/k8s.io/kubernetes"
export GO111MODULE=off GOPATH="$GP" CGO_ENABLED=0 GOFLAGS= GOCACHE="$GP/.gocache"

R2=vendor/github.com/modern-go/reflect2
rm -f $R2/*.go $R2/*.s
cp /usr/share/gocode/src/github.com/modern-go/reflect2/*.go /usr/share/gocode/src/github.com/modern-go/reflect2/*.s $R2/

# The same directory selection as Makefile.generated_files (KUBE_OPENAPI_TAG_FILES).
go build -o "$GP/bin/openapi-gen" ./vendor/k8s.io/kube-openapi/cmd/openapi-gen
DIRS=$(find -H . -not \( \( -path './_*' -o -path './.*' -o -path ./vendor \) -prune \) -type f -name '*.go' |
    sed 's|^./staging/src|vendor|; s|^./||' | xargs grep -l '^// *+k8s:' | xargs grep -l '+k8s:openapi-gen=' |
    grep -v -e '^vendor/k8s.io/code-generator/' -e '^vendor/k8s.io/sample-apiserver/' |
    sed 's|/[^/]*$||' | LC_ALL=C sort -u | sed 's|^|k8s.io/kubernetes/|' | paste -sd, -)
"$GP/bin/openapi-gen" --logtostderr -i "$DIRS" -p k8s.io/kubernetes/pkg/generated/openapi \
    -O zz_generated.openapi -h hack/boilerplate/boilerplate.generatego.txt \
    -r "$GP/openapi-violations.report" >&2

# GOPATH mode: vendored packages are named k8s.io/kubernetes/vendor/...
LDF="-s -w"
for V in k8s.io/kubernetes/vendor/k8s.io/component-base/version k8s.io/kubernetes/vendor/k8s.io/client-go/pkg/version; do
    LDF="$LDF -X $V.gitVersion=v1.20.2 -X $V.gitMajor=1 -X $V.gitMinor=20 -X $V.gitTreeState=clean -X $V.buildDate=1970-01-01T00:00:00Z"
done
mkdir -p "$CACHE"
go build -trimpath -ldflags "$LDF" -o "$BIN.tmp" ./cmd/kube-apiserver >&2
mv "$BIN.tmp" "$BIN"
echo "$BIN"
