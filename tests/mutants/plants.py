"""Planted bugs the suite must catch: each is a small change to the code that breaks a promise.

``tests/mutants/run.py`` (``make mutants``) applies one at a time, runs the tests named for it
and expects them to fail; the table it prints is kept in tests/README.md. A plant whose text no
longer matches the code fails ``tests/test_plants.py`` so that the check cannot rot unnoticed.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Plant:
    promise: str  # what a user relies on
    bug: str  # what the plant breaks
    module: str  # relative to the repository root
    old: str  # exact text, found exactly once (or, with ``every``, at least once)
    new: str
    tests: tuple[str, ...]  # pytest node ids that must catch it
    every: bool = False  # replace every occurrence

    def apply(self, source: str) -> str:
        """The source with the bug planted; ValueError where the text no longer matches."""
        found = source.count(self.old)
        if found == 0 or (found > 1 and not self.every):
            raise ValueError(f"{self.module}: {self.bug}: its text is found {found} times")
        return source.replace(self.old, self.new)


PLANTS = (
    Plant(
        "bit-identical restore of array views",
        "a numpy view's offset into its buffer is ignored",
        "jupyter_pause/kernel/arrays.py",
        'offset=record["offset"],',
        "offset=0,",
        (
            "tests/test_kernel_checkpoint.py::test_views_at_offsets_come_back_with_their_values_and_sharing",
        ),
    ),
    Plant(
        "bit-identical restore of tensor views",
        "a tensor's storage offset is ignored",
        "jupyter_pause/kernel/arrays.py",
        'tensor.set_(storage, record["offset"],',
        "tensor.set_(storage, 0,",
        (
            "tests/test_kernel_checkpoint.py::test_views_at_offsets_come_back_with_their_values_and_sharing",
        ),
    ),
    Plant(
        "kill -9 keeps the previous checkpoint",
        "the manifest is written before the data files are flushed and renamed",
        "jupyter_pause/kernel/writer.py",
        "        self.finish_files()\n"
        '        manifest["buffers"] = {d: loc.to_json() for d, loc in self.used.items()}\n'
        "        path = self.store.manifest_path(self.checkpoint_id)\n"
        '        write_file_atomically(path, json.dumps(manifest, separators=(",", ":")).encode())\n',
        '        manifest["buffers"] = {d: loc.to_json() for d, loc in self.used.items()}\n'
        "        path = self.store.manifest_path(self.checkpoint_id)\n"
        '        write_file_atomically(path, json.dumps(manifest, separators=(",", ":")).encode())\n'
        "        self.finish_files()\n",
        ("tests/test_crash_points.py",),
    ),
    Plant(
        "kill -9 keeps the previous checkpoint",
        "large (>= 64 MiB) data files are written straight to their final name",
        "jupyter_pause/kernel/writer.py",
        'self._tmp / f"{self._prefix}.{digest}.partial", direct=self.direct',
        "(final.parent.mkdir(mode=0o700, exist_ok=True), final)[1], direct=self.direct",
        ("tests/test_crash_points.py",),
    ),
    Plant(
        "a partial restore holds retention until the user decides",
        "retention ignores the hold",
        "jupyter_pause/kernel/retention.py",
        "        if self.retention_hold() is not None:\n",
        "        if False:\n",
        (
            "tests/test_faults.py::test_1_incomplete_restore_is_partial_and_retention_keeps_the_only_data",
        ),
    ),
    Plant(
        "notebook functions see the live namespace after restore",
        "functions keep a private copy of their globals",
        "jupyter_pause/kernel/snapshot.py",
        "if self._namespace is None or func.__globals__ is not self._namespace:",
        "if True:",
        ("tests/test_session_restore.py::test_notebook_functions_see_the_live_namespace",),
    ),
    Plant(
        "gradient accumulation continues across a pause",
        "gradients are not saved",
        "jupyter_pause/kernel/snapshot.py",
        "            if saved_as_buffer(grad):\n",
        "            if False:\n",
        ("tests/test_session_restore.py::test_gradients_come_back_and_accumulation_continues",),
    ),
    Plant(
        "no competing restores",
        "a second resume does not join the one in flight",
        "jupyter_pause/server/resuming.py",
        "            if path in self.sessions.tasks and record.state in (\n",
        "            if False and path in self.sessions.tasks and record.state in (\n",
        ("tests/test_server.py::test_twenty_concurrent_resumes_make_one_restore",),
    ),
    Plant(
        "the GPU queue is first come, first served",
        "last come, first served",
        "jupyter_pause/backends/local.py",
        "waiter = self.waiters.popleft()",
        "waiter = self.waiters.pop()",
        ("tests/test_gpu_queue.py",),
    ),
    Plant(
        "authorised like jupyter-server",
        "every @authorized check removed",
        "jupyter_pause/server/routes.py",
        "    @authorized\n",
        "",
        ("tests/test_authorization.py",),
        every=True,
    ),
    Plant(
        "checkpoint at 80% of the culler's timeout",
        "the threshold is 190%",
        "jupyter_pause/server/idle.py",
        "idle_for < 0.8 * self.cull_idle_seconds",
        "idle_for < 1.9 * self.cull_idle_seconds",
        ("tests/test_server.py::test_the_culler_checkpoint_comes_at_80_percent_of_its_timeout",),
    ),
    Plant(
        "young sessions are not auto-paused",
        "min_running_minutes ignored",
        "jupyter_pause/server/idle.py",
        "                and running_for >= rules.min_running_minutes * 60\n",
        "",
        ("tests/test_server.py::test_young_sessions_are_not_auto_paused",),
    ),
    Plant(
        "an edit is activity",
        "the activity endpoint does nothing",
        "jupyter_pause/server/routes.py",
        "self.orchestrator.note_user_activity(clean_path(path))",
        "clean_path(path)",
        ("tests/test_kernel_start.py::test_reading_state_is_not_activity_but_work_is",),
    ),
    Plant(
        "metrics count what happened",
        "the pauses counter never moves",
        "jupyter_pause/server/metrics.py",
        "PAUSES.labels(outcome=outcome).inc()",
        "PAUSES.labels(outcome=outcome)",
        ("tests/test_server.py::test_each_metric_moves_by_what_happened",),
    ),
    Plant(
        "live means the same process",
        "the token a resume checks is read after the pause (a reopened kernel's own)",
        "jupyter_pause/server/resuming.py",
        "paused_token = record.paused_process_token",
        "paused_token = record.process_token",
        (
            "tests/test_ways_back.py::test_reopened_then_resumed_restores_from_files_into_the_new_kernel",
            "tests/test_ways_back.py::test_restart_kernel_on_a_paused_notebook_then_resume",
        ),
    ),
)
