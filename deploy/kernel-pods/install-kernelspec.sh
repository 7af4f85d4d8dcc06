#!/bin/sh
# Install the kernel-pod kernelspec: deploy/kernel-pods/kernelspec/python-gpu-pod with
# gateway-provisioners' own launcher (launch_kubernetes.py, which renders our kernel-pod.yaml.j2
# beside it) copied in. Run where the JupyterLab server runs (its image), after
#   pip install 'gateway-provisioners[k8s]==0.4.0'
# Usage: install-kernelspec.sh [KERNELS_DIR]   (default: <sys.prefix>/share/jupyter/kernels)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
python=${PYTHON:-python3}
# find_spec, not import: importing gateway_provisioners.k8s loads the cluster's configuration
launchers=$("$python" -c 'import importlib.util, pathlib
spec = importlib.util.find_spec("gateway_provisioners")
assert spec, "gateway-provisioners is not installed: pip install gateway-provisioners[k8s]==0.4.0"
print(pathlib.Path(spec.origin).parent / "kernel-launchers")')
kernels=${1:-$("$python" -c 'import sys; print(sys.prefix)')/share/jupyter/kernels}
target="$kernels/python-gpu-pod"
mkdir -p "$target/scripts"
cp "$here/kernelspec/python-gpu-pod/kernel.json" "$target/"
cp "$here/kernelspec/python-gpu-pod/scripts/kernel-pod.yaml.j2" "$target/scripts/"
cp "$launchers/kubernetes/scripts/launch_kubernetes.py" "$target/scripts/"
echo "$target"
