"""The played gVisor admission policy (``gvisor_admission.py``) does what the shipped
``deploy/modes/pod-snapshots/gvisor-admission-policy.yaml`` says, against the real API server,
and refuses to play what the file does not say."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from .control_plane import SANDBOX_KEY, ControlPlane
from .gvisor_admission import (
    POLICY_FILE,
    PROBE_NAMESPACE,
    GvisorAdmission,
    ShippedPolicy,
    Unsupported,
)

WORKSPACE_LABEL = "notebooks.kubeflow.org/workspace-name"
SNAPSHOTS_LABEL = "jupyter-pause.io/snapshots"


def test_the_player_reads_the_shipped_policy_as_it_is_written() -> None:
    # Given the shipped file
    policy, _binding = yaml.safe_load_all(POLICY_FILE.read_text())

    # When the player reads it
    played = ShippedPolicy.read()

    # Then it plays exactly its match constraints and its one mutation: runtimeClassName gvisor
    assert played.configurations == [{"spec": {"runtimeClassName": "gvisor"}}]
    spec = policy["spec"]
    assert played.resource_rules == spec["matchConstraints"]["resourceRules"]
    assert played.object_selector == spec["matchConstraints"]["objectSelector"]
    assert (played.failure_policy, played.reinvocation_policy) == (
        spec["failurePolicy"],
        spec["reinvocationPolicy"],
    )


def edited(tmp_path: Path, change: Any) -> Path:
    """The shipped file with ``change(policy, binding)`` applied, written to ``tmp_path``."""
    policy, binding = (copy.deepcopy(d) for d in yaml.safe_load_all(POLICY_FILE.read_text()))
    change(policy, binding)
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump_all([policy, binding]))
    return path


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda p, b: p["spec"].update(matchConditions=[{"name": "x", "expression": "true"}]),
         "matchConditions"),
        (lambda p, b: p["spec"]["mutations"][0].update(patchType="JSONPatch"), "JSONPatch"),
        (lambda p, b: b["spec"].update(paramRef={"name": "x"}), "paramRef"),
        (lambda p, b: p["spec"]["mutations"][0]["applyConfiguration"].update(
            expression='Object{spec: Object.spec{runtimeClassName: string(1)}}'),
         "does not parse, at '(1)"),
        (lambda p, b: p["spec"]["mutations"][0]["applyConfiguration"].update(
            expression='Object{spec: Object.metadata{runtimeClassName: "gvisor"}}'),
         "Object.metadata where Object.spec belongs"),
    ],
)  # fmt: skip
def test_what_the_player_does_not_play_is_refused_by_name(
    tmp_path: Path, change: Any, named: str
) -> None:
    # Given the shipped file changed to use something the player does not play
    path = edited(tmp_path, change)

    # When it is read, Then the player refuses it, naming what
    with pytest.raises(Unsupported) as info:
        ShippedPolicy.read(path)
    assert named in str(info.value)


def dry_run(plane: ControlPlane, labels: dict[str, str]) -> dict[str, Any]:
    """A pod with ``labels`` as the API server would store it (every admission applied)."""
    from kubernetes import client

    with plane.admin.api_client() as api:
        answer = client.CoreV1Api(api).create_namespaced_pod(
            PROBE_NAMESPACE,
            {"metadata": {"generateName": "pod-", "labels": labels},
             "spec": {"containers": [{"name": "main", "image": "jupyterlab-pause:test"}]}},
            dry_run="All",
        )  # fmt: skip
        return api.sanitize_for_serialization(answer)


def test_in_force_it_puts_exactly_the_pods_it_matches_in_gvisor(
    gvisor_admission: GvisorAdmission, upstream_control_plane: ControlPlane
) -> None:
    # Given the played policy in force
    plane = upstream_control_plane

    # When the pod of a Workspace of the shipped kind is created (both labels)
    matched = dry_run(plane, {WORKSPACE_LABEL: "lab", SNAPSHOTS_LABEL: "manual"})

    # Then it runs in gVisor, and the RuntimeClass admission, run again after the change,
    # gave it GKE Sandbox's node selector and toleration
    assert matched["spec"]["runtimeClassName"] == "gvisor"
    assert matched["spec"]["nodeSelector"] == {SANDBOX_KEY: "gvisor"}
    assert {"key": SANDBOX_KEY, "operator": "Equal", "value": "gvisor",
            "effect": "NoSchedule"} in matched["spec"]["tolerations"]  # fmt: skip

    # But a pod that is not a Workspace's, or not of the kind's label, is left as it is
    for labels in (
        {SNAPSHOTS_LABEL: "manual"},
        {WORKSPACE_LABEL: "lab"},
        {WORKSPACE_LABEL: "lab", SNAPSHOTS_LABEL: "off"},
    ):
        assert not dry_run(plane, labels)["spec"].get("runtimeClassName"), labels
