"""A real control plane per test session; a namespace per test.

* ``upstream_control_plane``: etcd, kube-apiserver, kube-controller-manager and kube-scheduler,
  with Kubeflow Notebooks v2's own CRDs (``upstream-crds/``), GKE's podsnapshot.gke.io ones and
  GKE Sandbox's RuntimeClass ``gvisor``; no nodes (``register_node``) and no kubelet.
* ``gke_addon``: the real GKE Workspaces snapshot add-on on ``upstream_control_plane``, from the
  first test that asks for it to the end of the session (its webhooks see every namespace; it
  acts only on Workspaces or WorkspaceKinds annotated ``podsnapshot.gke.kubeflow.org/enabled``).
* ``real_chain``: a namespace of ``upstream_control_plane`` (with the shipped RBAC of each mode
  it uses) and the parts that cannot run here played on the real components
  (``real_players.py``: the Workspace controller, the kubelet, GKE's node agent). A test that
  wants the add-on asks for ``gke_addon`` before it, so its webhooks are registered before the
  first pod.
* ``gvisor_admission``: the shipped ``deploy/modes/pod-snapshots/gvisor-admission-policy.yaml``
  in force for one test, played as a mutating webhook (``gvisor_admission.py``: 1.20 has no
  admission policies); asked for before ``real_chain``, like ``gke_addon``. A test without it
  plays a cluster where that policy is not installed.
* ``kernel_pods`` (``kernel_pod_fixtures.py``): the kernel-pod backend's setting on ``real_chain``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ..built_tools import CannotRun
from .control_plane import (
    UPSTREAM_CRDS,
    ControlPlane,
    SnapshotAddon,
    addon_binary,
    apiserver_binary,
    kube_binary,
)
from .gvisor_admission import GvisorAdmission
from .kernel_pod_fixtures import kernel_pods, provisioner_registered  # noqa: F401 - fixtures
from .real_players import RealPlayedCluster, real_played_cluster


def _binary(get: Callable[[], str]) -> str:
    try:
        return get()
    except CannotRun as err:
        pytest.skip(f"CLUSTER TESTS SKIPPED: {err}")


@pytest.fixture(scope="session")
def upstream_control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    plane = ControlPlane(
        tmp_path_factory.mktemp("upstream-control-plane"),
        _binary(apiserver_binary),
        controller_manager=_binary(lambda: kube_binary("kube-controller-manager")),
        scheduler=_binary(lambda: kube_binary("kube-scheduler")),
    )
    try:
        plane.start()
        plane.load_crds(UPSTREAM_CRDS)
        plane.install_gvisor_runtime_class()
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="session")
def gke_addon(upstream_control_plane: ControlPlane) -> Iterator[SnapshotAddon]:
    addon = upstream_control_plane.start_snapshot_addon(_binary(addon_binary))
    try:
        yield addon
    finally:
        addon.stop()


@pytest.fixture(scope="session")
def gvisor_admission_server(
    upstream_control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GvisorAdmission]:
    """The played gVisor admission policy's webhook, served (in force only per test)."""
    player = GvisorAdmission(upstream_control_plane, tmp_path_factory.mktemp("gvisor-admission"))
    player.start()
    try:
        yield player
    finally:
        player.stop()


@pytest.fixture
def gvisor_admission(gvisor_admission_server: GvisorAdmission) -> Iterator[GvisorAdmission]:
    """The shipped gVisor admission policy in force for this test (played)."""
    gvisor_admission_server.register()
    try:
        yield gvisor_admission_server
    finally:
        gvisor_admission_server.unregister()
        errors, gvisor_admission_server.errors[:] = list(gvisor_admission_server.errors), []
        assert not errors, "the played gVisor admission policy failed:\n" + "\n".join(errors)


@pytest.fixture
def real_chain(upstream_control_plane: ControlPlane, tmp_path: Path) -> Iterator[RealPlayedCluster]:
    """A fresh namespace on the real components, the rest of the cluster played."""
    with real_played_cluster(upstream_control_plane, tmp_path) as played:
        yield played
