"""One real control plane (etcd + kube-apiserver) per test session; a namespace per test."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..built_tools import CannotRun
from .control_plane import ControlPlane, apiserver_binary
from .players import PlayedCluster

CRDS = Path(__file__).resolve().parent / "crds"
_numbers = itertools.count(1)


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    try:
        binary = apiserver_binary()
    except CannotRun as err:
        pytest.skip(f"CLUSTER TESTS SKIPPED: {err}")
    plane = ControlPlane(tmp_path_factory.mktemp("control-plane"), binary)
    try:
        plane.start()
        for crd in sorted(CRDS.glob("*.yaml")):
            plane.apply_file(crd)
        _wait_established(plane)
        yield plane
    finally:
        plane.stop()


def _wait_established(plane: ControlPlane) -> None:
    from kubernetes import client

    with plane.admin.api_client() as api:
        extensions = client.ApiextensionsV1Api(api)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            crds = extensions.list_custom_resource_definition().items
            if crds and all(
                any(
                    c.type == "Established" and c.status == "True"
                    for c in crd.status.conditions or []
                )
                for crd in crds
            ):
                return
            time.sleep(0.1)
    raise AssertionError("the test CRDs were not established in 30 s")


@pytest.fixture
def cluster(control_plane: ControlPlane) -> Iterator[PlayedCluster]:
    """A fresh namespace with the shipped Role, and the cluster's other parts played."""
    played = PlayedCluster(control_plane, f"team-{next(_numbers)}")
    played.create_namespace()
    played.start()
    try:
        yield played
    finally:
        played.close()
