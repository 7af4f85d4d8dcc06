"""The kernel-pod backend (``jupyter_pause/backends/kernel_pod_provisioner.py``) on the real
control plane: JupyterLab's KernelManager launches each kernel as a pod through the shipped
kernelspec (``deploy/kernel-pods/``, installed by its own script) and gateway-provisioners'
launcher; the real kube-scheduler places the pod on a node the test registered with one
``nvidia.com/gpu``; the played kubelet (``real_players.py``) runs the pod's command, gateway's
``launch_ipykernel.py``, as a real ipykernel process with the pod's environment, which sends its
connection info back to the provisioner. Every API call of the provisioner and its launcher is
made with the server's ServiceAccount token and nothing but ``deploy/kernel-pods/rbac.yaml``.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from .kernel_pod_fixtures import (
    KernelPods,
    other_team_holds_the_gpu,
    run_cell,
    scheduled,
    until,
)
from .real_players import core

pytest.importorskip("gateway_provisioners", reason="the kernel-pod backend's tests")


def test_a_kernel_pod_runs_pauses_without_its_gpu_and_resumes_under_its_id_from_files(
    kernel_pods: KernelPods,
) -> None:
    from jupyter_pause.backends.kernel_pod_provisioner import KernelPodProvisioner, resume_kernel

    cluster = kernel_pods.cluster

    async def scenario() -> None:
        # Given a kernel started through the shipped kernelspec
        manager = kernel_pods.manager()
        restarts: list[str] = []
        manager.add_restart_callback(lambda: restarts.append("restart"), "restart")
        await manager.start_kernel(env=kernel_pods.env())
        try:
            assert isinstance(manager.provisioner, KernelPodProvisioner)
            kernel_id = manager.kernel_id

            # Then it is one pod, placed by the real scheduler on the GPU node, asking one GPU
            (pod,) = kernel_pods.kernel_pods()
            assert pod["metadata"]["labels"]["kernel_id"] == kernel_id
            assert pod["spec"]["nodeName"] == f"{cluster.pool}-gpu"
            (container,) = pod["spec"]["containers"]
            assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
            assert pod["spec"]["automountServiceAccountToken"] is False
            # and the launcher's connection info came to upstream's response manager, whose
            # socket now waits without holding the event loop (upstream's 10 ms accept timeout,
            # tried every 0.1 ms, held it most of the time: bench/event_loop_hops.py)
            listening = manager.provisioner.response_manager._response_socket
            assert listening.gettimeout() == 0.0
            # and a real ipykernel: the pod's own process (the played kubelet's), its env
            played = cluster.pods[pod["metadata"]["uid"]].container
            assert played is not None
            facts = json.loads(
                await run_cell(
                    manager,
                    "import os, json\n"
                    "print(json.dumps([os.getpid(), type(get_ipython().kernel).__module__,"
                    " os.environ['KERNEL_ID']]))",
                )
            )
            assert facts == [played.process.pid, "ipykernel.ipkernel", kernel_id]
            # When the notebook's state is checkpointed and the kernel paused
            await run_cell(
                manager,
                "weights = [1.5, 2.5]\nstep = 41\n"
                "saved = __import__('jupyter_pause').checkpoint()\n"
                "assert {'weights', 'step'} <= set(saved.saved), saved.summary()",
            )
            await manager.provisioner.pause()

            # Then its pod is gone and the kernel is the same: its id, its manager, "alive"
            assert kernel_pods.kernel_pods() == []
            assert played.process.poll() is not None  # the kernel's process ended with it
            assert manager.kernel_id == kernel_id and manager.has_kernel
            assert await manager.is_alive()  # paused is not dead
            # and its GPU is free: another team's GPU pod is scheduled on that node
            other_ns, other = await other_team_holds_the_gpu(kernel_pods)
            cluster.release_gpus()
            # and the restarter, looking every 0.5 s, brought nothing back in 5 s
            await asyncio.sleep(5)
            assert restarts == [] and kernel_pods.kernel_pods() == []

            # When it is resumed (the other pod gone, the GPU free)
            await until(
                lambda: cluster.api.get(core(other_ns, "pods", other)) is None,
                60,
                "the other team's pod to be gone",
                cluster,
            )
            await resume_kernel(manager)

            # Then one new pod runs the kernel under the same id, a new process
            (again,) = kernel_pods.kernel_pods()
            assert again["metadata"]["labels"]["kernel_id"] == kernel_id
            assert again["metadata"]["uid"] != pod["metadata"]["uid"]
            assert manager.kernel_id == kernel_id and not manager.provisioner.paused
            # and the variables come back from the checkpoint files
            restored = await run_cell(
                manager,
                "%load_ext jupyter_pause\n"
                "import json\n"
                "result = __import__('jupyter_pause').restore()\n"
                "print(json.dumps([result.complete, sorted(result.restored), weights, step]))",
            )
            assert json.loads(restored) == [True, ["step", "weights"], [1.5, 2.5], 41]
        finally:
            await manager.shutdown_kernel(now=True)
        # and a shutdown deletes the pod for good
        await until(lambda: kernel_pods.kernel_pods() == [], 60, "no kernel pod", cluster)

    asyncio.run(scenario())


def test_a_resume_without_a_free_gpu_waits_with_the_schedulers_reason_past_the_launch_timeout_and_a_pod_made_anew(
    kernel_pods: KernelPods,
) -> None:
    from jupyter_pause.backends.kernel_pod_provisioner import resume_kernel

    cluster = kernel_pods.cluster
    launch_timeout = 5

    async def scenario() -> None:
        # Given a paused kernel pod whose launch timeout is 5 s
        manager = kernel_pods.manager(launch_timeout=launch_timeout)
        await manager.start_kernel(env=kernel_pods.env())
        try:
            kernel_id = manager.kernel_id
            await manager.provisioner.pause()
            # and another team's pod holding the only GPU meanwhile
            await other_team_holds_the_gpu(kernel_pods)

            # When the kernel is resumed
            resume = asyncio.create_task(resume_kernel(manager))

            # Then it waits, saying the scheduler's reason, for three times its launch timeout
            reason = await until(
                lambda: manager.provisioner.waiting_reason, 60, "the reason of the wait", cluster
            )
            assert "Insufficient nvidia.com/gpu" in reason, reason
            await asyncio.sleep(3 * launch_timeout)
            assert not resume.done(), resume
            (waiting,) = kernel_pods.kernel_pods()
            assert waiting["status"]["phase"] == "Pending" and not scheduled(waiting)
            assert "Insufficient nvidia.com/gpu" in manager.provisioner.waiting_reason

            # When its pod is made anew (what a GPU freed by a pause of this server's does)
            assert await asyncio.to_thread(manager.provisioner.requeue)

            # Then a new pod of the same name, labels, owner and spec waits in its place, and
            # the resume waits on with the reason (no verdict on the new pod changes it)
            (anew,) = kernel_pods.kernel_pods()
            assert anew["metadata"]["uid"] != waiting["metadata"]["uid"]
            for kept in ("name", "labels", "annotations", "ownerReferences"):
                assert anew["metadata"].get(kept) == waiting["metadata"].get(kept), kept
            assert anew["spec"]["containers"] == waiting["spec"]["containers"]
            assert "nodeName" not in anew["spec"]
            assert "Insufficient nvidia.com/gpu" in manager.provisioner.waiting_reason
            assert not resume.done(), resume

            # When something put a finalizer on it (it would not be gone at once when deleted)
            path = core(kernel_pods.namespace, "pods", anew["metadata"]["name"])
            held = {"metadata": {"finalizers": ["example.com/hold"]}}
            cluster.api.merge(path, held)
            # Then it is not made anew, and stays as it is
            assert not await asyncio.to_thread(manager.provisioner.requeue)
            (same,) = kernel_pods.kernel_pods()
            assert same["metadata"]["uid"] == anew["metadata"]["uid"]
            cluster.api.merge(path, {"metadata": {"finalizers": None}})

            # When the other team's pod goes
            cluster.release_gpus()

            # Then the resume completes: the kernel runs again under its id, on the GPU node
            await asyncio.wait_for(resume, 120)
            assert manager.provisioner.waiting_reason is None
            (pod,) = kernel_pods.kernel_pods()
            assert pod["metadata"]["labels"]["kernel_id"] == kernel_id
            assert pod["spec"]["nodeName"] == f"{cluster.pool}-gpu"
            assert await run_cell(manager, "print(6 * 7)") == "42\n"
            # and a pod with a node is never made anew
            assert not await asyncio.to_thread(manager.provisioner.requeue)
            (still,) = kernel_pods.kernel_pods()
            assert still["metadata"]["uid"] == pod["metadata"]["uid"]
        finally:
            await manager.shutdown_kernel(now=True)

    asyncio.run(scenario())


def test_the_shipped_rbac_lets_the_servers_account_manage_and_snapshot_pods_in_its_namespace_only(
    kernel_pods: KernelPods,
) -> None:
    from kubernetes import client

    # Given the server's ServiceAccount with deploy/kernel-pods/rbac.yaml (the fixture's), as
    # the provisioner calls the API (the Kubernetes client's default configuration)
    namespace = kernel_pods.namespace
    verbs = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")
    snapshots = "podsnapshot.gke.io"
    resources = ("pods", "pods/exec", "pods/log", "pods/status", "secrets", "configmaps",
                 "services", "serviceaccounts", "events", f"{snapshots}:podsnapshotpolicies",
                 f"{snapshots}:podsnapshotmanualtriggers", f"{snapshots}:podsnapshots",
                 f"{snapshots}:podsnapshotstorageconfigs")  # fmt: skip

    # When the API server is asked about every verb on each resource, here and in "default"
    allowed = set()
    with client.ApiClient() as api:
        authorization = client.AuthorizationV1Api(api)
        for where in (namespace, "default"):
            for resource in resources:
                api_group, _, named = resource.rpartition(":")
                kind, _, sub = named.partition("/")
                for verb in verbs:
                    attributes = {
                        "namespace": where,
                        "verb": verb,
                        "resource": kind,
                        "group": api_group,
                    }
                    if sub:
                        attributes["subresource"] = sub
                    review = authorization.create_self_subject_access_review(
                        {"spec": {"resourceAttributes": attributes}}
                    )
                    if review.status.allowed:
                        allowed.add((where, resource, verb))

    # Then it may manage pods and snapshot them in its own namespace, nothing else
    wanted = {
        *((namespace, "pods", v) for v in ("create", "delete", "get", "list", "watch", "patch")),
        (namespace, f"{snapshots}:podsnapshotpolicies", "list"),
        *((namespace, f"{snapshots}:podsnapshotmanualtriggers", v)
          for v in ("create", "get", "delete")),
        *((namespace, f"{snapshots}:podsnapshots", v) for v in ("get", "delete")),
    }  # fmt: skip
    assert allowed == wanted, allowed ^ wanted


@pytest.mark.parametrize(
    ("place", "written"),
    [(1, "1st"), (2, "2nd"), (3, "3rd"), (4, "4th"), (11, "11th"), (12, "12th"), (13, "13th"),
     (21, "21st"), (22, "22nd"), (101, "101st"), (111, "111th")],
)  # fmt: skip
def test_a_place_in_line_is_written_as_an_ordinal(place: int, written: str) -> None:
    from jupyter_pause.backends.kernel_pods import ordinal

    assert ordinal(place) == written
