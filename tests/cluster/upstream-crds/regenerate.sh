#!/usr/bin/env bash
# Rewrites kubeflow.org_workspaces.yaml and kubeflow.org_workspacekinds.yaml here from a clone of
# kubeflow/notebooks at the pinned commit, with the changes kube-apiserver 1.20 needs (see
# README.md). Only to update or check them: the tests read the files committed here, never the
# network.
# Usage: tests/cluster/upstream-crds/regenerate.sh PATH/TO/notebooks/.git [COMMIT]
set -euo pipefail
GIT_DIR=${1:?the git directory of a kubeflow/notebooks clone}
COMMIT=${2:-8b6105775132f4ea0af2a1dc3833519789651233}
HERE=$(cd "$(dirname "$0")" && pwd)
for NAME in kubeflow.org_workspaces.yaml kubeflow.org_workspacekinds.yaml; do
    # 1.20.2 rejects `default: ""` on these string fields ("must be of type string"); nothing else
    # is changed (the CEL x-kubernetes-validations are dropped by 1.20 itself when the CRD is created).
    # The same validator takes any "" for null, so a Workspace's status.podTemplatePod cannot hold
    # upstream's "" name/nodeName (no pod, or not scheduled yet): its `required: [name, nodeName]`
    # goes too, and the played controller leaves the empty ones out (see README.md).
    git --git-dir="$GIT_DIR" show "$COMMIT:workspaces/controller/manifests/kustomize/base/crd/$NAME" |
        grep -v '^ *default: ""$' |
        perl -0pe 's/(\n {20}example: ws-my-workspace\n {20}type: string\n) {16}required:\n {16}- name\n {16}- nodeName\n/$1/' \
            >"$HERE/$NAME"
done
