#!/usr/bin/env bash
# The real Kubernetes parts of the cluster tests, built once per machine and cached:
# kube-apiserver, kube-controller-manager and kube-scheduler v1.20.2, all three from one source tree.
#
# No ready kube-apiserver exists in Debian, PyPI or npm; Debian bookworm's `kubernetes` source
# package holds the full upstream v1.20.2 tree with vendor/, which Debian's Go 1.19 builds in
# GOPATH mode (after generating the OpenAPI file the tarball lacks, and with the vendored
# reflect2 1.0.1, which crashes under Go >= 1.18, replaced by Debian's 1.0.2). The three
# binaries are built by one `go build`, so the packages they share are compiled once. Also
# installs etcd-server, which the control plane needs. ~10-14 min on 2 cores the first time
# (measured in .ci/run's log: "kube binaries ready after").
#
# Usage: tests/cluster/kube-apiserver.sh [NAME] -> prints the path of NAME (kube-apiserver,
#            kube-controller-manager or kube-scheduler; default kube-apiserver), building all
#            three when one of them is missing (a cache made before the other two were built)
#        JUPYTER_PAUSE_CACHE_ONLY=1 ...        -> prints it only when all three are cached, else
#            exits 3 (no build)
set -euo pipefail

VERSION=1.20.5+really1.20.2-1.1+deb12u1
NAMES="kube-apiserver kube-controller-manager kube-scheduler"
WANTED=${1:-kube-apiserver}
case " $NAMES " in *" $WANTED "*) ;; *) echo "unknown binary $WANTED (one of: $NAMES)" >&2; exit 2 ;; esac
CACHE=${JUPYTER_PAUSE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/jupyter-pause}
BIN=$CACHE/$WANTED-$VERSION
all_cached() {
    for NAME in $NAMES; do [ -x "$CACHE/$NAME-$VERSION" ] || return 1; done
}
if all_cached && command -v etcd >/dev/null; then
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
SOURCES=/etc/apt/sources.list.d/jupyter-pause-deb-src.sources
if [ ! -f "$SOURCES" ]; then
    printf 'Types: deb-src\nURIs: http://deb.debian.org/debian\nSuites: bookworm bookworm-updates\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\nTypes: deb-src\nURIs: http://deb.debian.org/debian-security\nSuites: bookworm-security\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' >"$SOURCES"
    apt_get update -qq >&2
fi
command -v etcd >/dev/null || apt_install etcd-server
all_cached && { echo "$BIN"; exit 0; }
apt_install golang-go golang-github-modern-go-reflect2-dev dpkg-dev

build_started=$(date +%s)
GP=$(mktemp -d "${TMPDIR:-/tmp}/kube-build.XXXXXX")
trap 'rm -rf "$GP"' EXIT
mkdir -p "$GP/src/k8s.io"
(cd "$GP/src/k8s.io" && apt_get source -qq "kubernetes=$VERSION" >&2 && mv kubernetes-1.20.5+really1.20.2 kubernetes)
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
echo "source and openapi-gen: $(($(date +%s) - build_started)) s" >&2
mkdir -p "$CACHE"
# kube-apiserver first, then the other two: they share most packages (client-go, apimachinery,
# ...), which the second build takes from the go build cache. The timing lines say what each
# costs (the README's build times come from them).
started=$(date +%s)
go build -trimpath -ldflags "$LDF" -o "$GP/bin/kube-apiserver" ./cmd/kube-apiserver >&2
echo "go build kube-apiserver: $(($(date +%s) - started)) s" >&2
started=$(date +%s)
go build -trimpath -ldflags "$LDF" -o "$GP/bin/" ./cmd/kube-controller-manager ./cmd/kube-scheduler >&2
echo "go build kube-controller-manager and kube-scheduler: $(($(date +%s) - started)) s" >&2
for NAME in $NAMES; do
    cp "$GP/bin/$NAME" "$CACHE/$NAME-$VERSION.tmp"
    mv "$CACHE/$NAME-$VERSION.tmp" "$CACHE/$NAME-$VERSION"
done
echo "$BIN"
