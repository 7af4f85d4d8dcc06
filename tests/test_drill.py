"""``jupyter pause drill`` end to end on the local backend, and each probe catching its fault.

The drill runs as a user runs it (a subprocess) against the real test server. The faults are
real components that misbehave, put in the server before the drill starts: a GPU pool that
never gets its GPU back, an orchestrator that starts a second restore instead of joining the
one in flight, and a store holding a manifest of another format (so deleted checkpoints
leave their data on disk).
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest

from jupyter_pause.backends.local import GpuPool
from jupyter_pause.kernel import store as store_mod
from jupyter_pause.server.resuming import Resumes

from .cli_runner import Cli
from .drill_own_server import drill_left_in_tmp, keep_then_check, run_drill
from .server_process import start_server
from .servers import Server, pause_and_wait

pytest.importorskip("torch")
pytest.importorskip("matplotlib")

MAIN = "pause-drill/drill.ipynb"


def between(events: list[dict[str, Any]], first: str, then: str, nth: int = 0) -> float:
    """Seconds from the ``nth`` ``first`` event to the next ``then`` event."""
    starts = [e["at"] for e in events if e["kind"] == first]
    start = starts[nth]
    return next(e["at"] for e in events if e["kind"] == then and e["at"] >= start) - start


async def drill(jp: Cli, out: Path, *options: str) -> tuple[int, str, str, dict[str, Any]]:
    code, stdout, stderr = await jp("drill", "--out", str(out), "--timeout", "40", *options)
    report = json.loads((out / "report.json").read_text()) if (out / "report.json").exists() else {}
    return code, stdout, stderr, report


def failures(report: dict[str, Any]) -> dict[str, str]:
    return {c["name"]: c["detail"] for c in report["checks"] if c["status"] == "fail"}


async def test_the_drill_passes_on_the_local_backend_with_numbers_from_the_timeline(
    server: Server, jp: Cli, tmp_path: Path, jp_root_dir: Path
) -> None:
    # When the drill runs against a server with one GPU to hand out, with a rush of 2
    out = tmp_path / "drill"
    code, stdout, stderr, report = await drill(jp, out, "--rush", "2")

    # Then every check passes (or says it cannot be measured here), one line per step
    assert code == 0, stderr
    assert failures(report) == {}
    assert [line[:5] for line in stderr.splitlines() if line.startswith("[")] == [
        f"[{step}/8]" for step in range(1, 9)
    ]
    assert "[8/8] Clean-up: " in stderr
    # and nothing the drill wrote on the server is left: notebooks, data, their folder
    assert not (jp_root_dir / "pause-drill").exists()
    statuses = {c["name"]: c["status"] for c in report["checks"]}
    assert statuses["GPU memory released"] == "not measurable here"  # no GPU on this machine
    assert statuses["GPU released"] == statuses["model output bit-identical"] == "pass"
    assert statuses["rush: served in order"] == statuses["one restore for two requests"] == "pass"
    assert sorted(p.name for p in out.iterdir()) == [
        "morning-rush.png",
        "report.json",
        "report.md",
        "resume-vs-rerun.png",
    ]
    assert "# Pause drill: passed" in (out / "report.md").read_text()

    # And its numbers are the timeline's: the first pause and the first resume of the notebook
    _, timeline = await server.call("GET", "timeline", MAIN)
    events = timeline["events"]
    assert report["pause"]["to_gpu_released"] == between(events, "pause_requested", "gpu_released")
    assert report["resume"]["timeline_to_ready"] == between(
        events, "resume_requested", "kernel_ready"
    )
    assert report["resume"]["how"] == "files"
    assert 0 < report["resume"]["timeline_to_ready"] < report["resume"]["to_ready_seconds"] + 1
    # the probe's wait: from its resume request until the GPU came back (the second resume)
    assert report["probe"]["waited_seconds"] == between(
        events, "resume_requested", "resources_acquired", nth=1
    )
    assert "all 1 GPU(s) are in use" in report["probe"]["reason"]
    # the rush: each notebook's wait is its own timeline's, the second to ask (the resumes are
    # sent at once: which one the server heard first is not fixed) waited for the first
    rows = sorted(report["rush"]["rows"], key=lambda row: row["requested"])
    for row in rows:
        _, own = await server.call("GET", "timeline", row["path"])
        assert row["waited_seconds"] == between(
            own["events"], "resume_requested", "resources_acquired", nth=-1
        )
        assert row["restores"] == 1 and row["outcome"] == "restored"
    assert rows[1]["waited_seconds"] > rows[0]["waited_seconds"]
    assert rows[1]["reason"].startswith("Waiting for a GPU: all 1 GPU(s) are in use")
    # the clean-up freed the checkpoints' data: only the session records are left
    storage = report["storage"]
    assert storage["bytes_freed"] > 0
    assert all(
        r["checkpoints_after"] == 0 and r["bytes_after"] < 64 * 1024 for r in storage["rows"]
    )

    # And the GPU-hours report of the same server counts the drill's resumes and restores
    code, stdout, stderr = await jp("report", "--json", "--since", "1d")
    assert code == 0, stderr
    usage = json.loads(stdout)
    resumes = 0
    for nb in (await server.call("GET", "usage"))[1]["notebooks"]:
        resumes += sum(1 for e in nb["events"] if e["kind"] == "kernel_ready")
    assert usage["resume_latency_seconds"]["to_ready"]["count"] == resumes > 0
    assert usage["restores"]["files"] == resumes
    assert usage["totals"]["gpu_hours_released"] > 0


async def test_the_clean_up_keeps_what_keep_asks_for_and_the_users_own_files(
    server: Server, jp: Cli, tmp_path: Path, jp_root_dir: Path
) -> None:
    # Given a file of the user's in the drill's folder
    folder = jp_root_dir / "pause-drill"
    folder.mkdir()
    (folder / "notes.md").write_text("mine\n")

    # When the drill runs with --keep
    code, _, stderr, report = await drill(jp, tmp_path / "drill", "--rush", "0", "--keep")

    # Then what is left is the drill notebook, paused, its data (for --upgrade-check) and the
    # user's file; the drill's other notebooks are gone
    assert code == 0, stderr
    left = sorted(
        p.relative_to(folder).as_posix()
        for p in folder.rglob("*")
        if ".ipynb_checkpoints" not in p.parts
    )
    assert left == [
        "drill-data",
        "drill-data/input.npy",
        "drill-data/result.json",
        "drill.ipynb",
        "notes.md",
    ]
    assert (folder / "notes.md").read_text() == "mine\n"
    _, record = await server.call("GET", "sessions", MAIN)
    assert record["state"] == "paused"
    deleted = {c["name"]: c for c in report["checks"]}["drill's files deleted"]
    assert deleted["status"] == "pass", deleted
    # and the report folder holds the drill notebook's session file, the upgrade's fallback
    assert (tmp_path / "drill" / "drill-session.jpsession").stat().st_size > 0
    assert "digest" in json.loads((tmp_path / "drill" / "drill-expected.json").read_text())

    # When the upgrade check runs on a new server that has neither (another cluster)
    new_root = tmp_path / "new-root"
    new_root.mkdir()
    store = tmp_path / "new-store"
    other = start_server(
        tmp_path / "new-server",
        new_root,
        f"c.PauseApp.backend = 'local'\nc.PauseApp.store_root = {str(store)!r}\n",
    )
    try:
        new_jp = Cli(other.server.url, other.server.token, tmp_path / "new-server" / "runtime")
        code, stdout, stderr = await new_jp(
            "drill", "--upgrade-check", "--out", str(tmp_path / "drill")
        )
        # Then it imports the session file, resumes it from files, and the output is the same
        assert code == 0, stderr
        assert f"{MAIN} is not on this server: importing" in stderr, stderr
        assert stdout.startswith(f"{MAIN}: restored from files: a new process"), stdout
        assert "imported from drill-session.jpsession" in stdout, stdout
        assert (new_root / MAIN).exists()
    finally:
        other.stop()


class NeverReleasingPool(GpuPool):
    """A pool that never gets a GPU back: a stopped kernel's GPU stays counted as held."""

    def release(self, path: str) -> None:
        self._announce()


async def test_the_drill_fails_when_the_gpu_is_not_released(
    server: Server, jp: Cli, tmp_path: Path
) -> None:
    server.orchestrator.backend.pool = NeverReleasingPool(1)
    code, _, stderr, report = await drill(jp, tmp_path / "drill", "--rush", "0")
    assert code == 1
    assert failures(report)["GPU released"].startswith(
        "the GPU was not released: 0 of 1 free, still held by pause-drill/drill.ipynb"
    )
    assert "FAILED GPU released: the GPU was not released" in stderr


class RestoresTwice(Resumes):
    """Starts another restore for a resume request while one is in flight (never joins)."""

    async def start(self, record: Any, on_cpu: bool = False) -> Any:
        record = await super().start(record, on_cpu)
        task = self.sessions.tasks.get(record.path)
        started = self.__dict__.setdefault("started_restores", set())  # (set by __class__)
        if task is not None and task in started:  # this request joined: start another anyway
            record.timeline.add("resume_requested")
            self.kernels.spawn(self.run(record))
        elif task is not None:
            started.add(task)
        return record


async def test_the_drill_fails_when_a_second_restore_runs(
    server: Server, jp: Cli, tmp_path: Path
) -> None:
    server.orchestrator.resumes.__class__ = RestoresTwice
    code, _, _, report = await drill(jp, tmp_path / "drill", "--rush", "0")
    assert code == 1
    assert failures(report)["one restore for two requests"] == (
        "2 restores started for 2 requests: a second restore ran"
    )


async def test_the_drill_fails_when_deleted_checkpoints_keep_their_data(
    server: Server, jp: Cli, tmp_path: Path, pause_store: Path, jp_root_dir: Path
) -> None:
    # Given a drill running, which reaches its clean-up (its clean-up notebook appears)
    running = asyncio.ensure_future(drill(jp, tmp_path / "drill", "--rush", "0"))
    cleanup = jp_root_dir / "pause-drill" / "cleanup.ipynb"
    while not cleanup.exists():
        assert not running.done(), running.result()[2]
        await asyncio.sleep(0.05)

    # When a manifest of another format lands in the drill notebook's store folder (a newer
    # jupyter_pause wrote it): no data file of that notebook may be collected any more
    store = store_mod.NotebookStore(pause_store, str(jp_root_dir / MAIN))
    store.manifest_path(0).write_text(json.dumps({"format": 999}))
    store.manifest_path(0).chmod(0o600)

    # Then the drill sees the deleted checkpoints' data still on disk, and fails saying so
    code, _, stderr, report = await running
    assert code == 1
    detail = failures(report).get("checkpoints deleted and storage freed", stderr)
    assert detail.startswith(f"{MAIN}: its checkpoints were deleted but "), detail
    assert detail.endswith(
        "remain in its store folder (0 checkpoint(s) left): the storage was not freed"
    )


async def prepare_drill_notebook(server: Server) -> str:
    """What the drill leaves with --keep: its notebook run, with its result file; the kernel."""
    from jupyter_pause.cli.drill import notebook

    await server.fetch(
        "api", "contents", "pause-drill", method="PUT", body=json.dumps({"type": "directory"})
    )
    kernel_id = await server.open_notebook(MAIN)
    for code in notebook.cells("seed"):
        await server.run(kernel_id, code)
    await server.watched(MAIN)
    return kernel_id


async def test_upgrade_check_tells_live_from_files_from_a_new_session(
    server: Server, jp: Cli, tmp_path: Path
) -> None:
    out = tmp_path / "check"
    # Given the drill notebook whose process wrote its checkpoint and still runs
    await prepare_drill_notebook(server)
    # Then it is the live process: its liveness token is the checkpoint's
    code, stdout, stderr = await jp("drill", "--upgrade-check", "--out", str(out))
    assert code == 0, stderr
    assert stderr == f"Upgrade check of the server at {jp.url}\n", stderr  # which one it examined
    assert stdout.startswith(f"{MAIN}: live process: its liveness token is the one of")

    # Given it was paused (as before a migration); when the check runs, it resumes it
    await pause_and_wait(server, MAIN)
    code, stdout, stderr = await jp("drill", "--upgrade-check", "--out", str(out))
    # Then a new process came back with the state: restored from files
    assert code == 0, stderr
    assert stdout.startswith(f"{MAIN}: restored from files: a new process (another liveness")
    assert json.loads((out / "upgrade-check.json").read_text())["output_identical"] is True

    # Given it was paused again, and the notebook merely opened in a new session
    await pause_and_wait(server, MAIN)
    await server.open_notebook(MAIN)
    # Then the check says nothing came back, and exits 1
    code, stdout, _ = await jp("drill", "--upgrade-check", "--out", str(out))
    assert code == 1
    assert stdout.startswith(f"{MAIN}: not restored: a new session that merely opened the old")


def test_an_own_servers_kept_drill_is_found_by_the_next_own_servers_upgrade_check(
    tmp_path: Path,
) -> None:
    # Given `drill --own-server --keep` before the upgrade; when `--own-server --upgrade-check`
    # runs after it, in another process with another server
    _kept, checked = keep_then_check(tmp_path)
    # Then it found the kept notebook and brought it back from files
    assert checked.startswith(f"{MAIN}: restored from files: a new process"), checked
    assert "imported from" not in checked
    # and an upgrade check with nothing kept says which folder it examined
    (tmp_path / "pause-drill-report").rename(tmp_path / "old-report")
    nothing = run_drill(tmp_path, "--own-server", "--upgrade-check", "--server-dir", "elsewhere")
    assert nothing.returncode == 1
    assert "upgrade check of the drill's own server (nothing kept in elsewhere)" in nothing.stderr
    assert drill_left_in_tmp(tmp_path) == []


def test_an_own_servers_temporary_folder_goes_on_failure_and_on_ctrl_c(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys
    import time

    # When the drill fails on its own server (asked for a backend the server does not run)
    failed = run_drill(tmp_path, "--own-server", "--backend", "no-such-backend")
    assert failed.returncode == 1
    assert "stopped early: the server uses the local backend, not no-such-backend" in (
        failed.stderr
    ), failed.stderr[-2000:]
    # Then its server's temporary folder is gone all the same
    assert drill_left_in_tmp(tmp_path) == []

    # When a drill on its own server is interrupted while it runs
    env = {k: v for k, v in os.environ.items() if not k.startswith("JUPYTER")}
    env.update(TMPDIR=str(tmp_path / "tmp"), JUPYTER_DATA_DIR=str(tmp_path / "data"))
    drill_process = subprocess.Popen(
        [sys.executable, "-m", "jupyter_pause.cli", "drill", "--own-server", "--rush", "0"],
        # Ctrl-C as in a terminal: a test run in the background (`cmd &`) inherits SIGINT
        # ignored, and Python then leaves it so
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    deadline = time.monotonic() + 120
    while not list((tmp_path / "tmp").glob("pause-drill-*/root/pause-drill")):
        assert time.monotonic() < deadline and drill_process.poll() is None
        time.sleep(0.2)
    drill_process.send_signal(signal.SIGINT)
    _, stderr = drill_process.communicate(timeout=120)
    # Then its server stops and its temporary folder goes
    assert drill_process.returncode == 130, stderr
    assert "the drill's own server stopped and its temporary folder removed" in stderr, stderr
    assert drill_left_in_tmp(tmp_path) == []
