"""Prometheus metrics, served on jupyter-server's own ``/metrics``.

For the platform team and whoever pays: how many pauses and resumes, how they ended, how
long the way back took, and how many GPU-seconds were handed back to the pool.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import REGISTRY, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

PAUSES = Counter("jupyter_pause_pauses_total", "Pauses, by outcome", ["outcome"])
RESUMES = Counter("jupyter_pause_resumes_total", "Resumes, by how the state came back", ["how"])
CHECKPOINT_BYTES = Counter(
    "jupyter_pause_checkpoint_bytes_written_total", "Bytes written by checkpoints"
)
CHECKPOINT_FAILURES = Counter("jupyter_pause_checkpoint_failures_total", "Checkpoints that failed")
RESUME_TO_READY = Histogram(
    "jupyter_pause_resume_to_ready_seconds",
    "From a resume request to a kernel ready with the state restored",
    buckets=(1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800),
)
RESUME_TO_NEXT_CELL = Histogram(
    "jupyter_pause_resume_to_next_cell_seconds",
    "From a resume request to the researcher's next executed cell",
    buckets=(5, 10, 30, 60, 120, 300, 600, 1800, 3600),
)


def checkpoint_written(nbytes: int) -> None:
    CHECKPOINT_BYTES.inc(nbytes)


def checkpoint_failed() -> None:
    CHECKPOINT_FAILURES.inc()


def pause_finished(outcome: str) -> None:
    PAUSES.labels(outcome=outcome).inc()


def resume_finished(how: str, seconds: float | None) -> None:
    RESUMES.labels(how=how).inc()
    if seconds is not None:
        RESUME_TO_READY.observe(seconds)


def resume_to_next_cell(seconds: float) -> None:
    RESUME_TO_NEXT_CELL.observe(seconds)


class SnapshotCollector(Collector):
    """Gauges read at scrape time from the orchestrator, so they can never drift."""

    def __init__(self, snapshot: Callable[[], dict[str, Any]]) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[GaugeMetricFamily]:
        data = self.snapshot()
        sessions = GaugeMetricFamily(
            "jupyter_pause_sessions",
            "Notebook sessions known to jupyter_pause, by state",
            labels=["state"],
        )
        for state, count in data["sessions"].items():
            sessions.add_metric([state], count)
        yield sessions
        yield GaugeMetricFamily(
            "jupyter_pause_gpus_total",
            "Accelerators the backend may hand out",
            value=data["gpus_total"],
        )
        yield GaugeMetricFamily(
            "jupyter_pause_gpus_free", "Accelerators free now", value=data["gpus_free"]
        )
        yield GaugeMetricFamily(
            "jupyter_pause_gpus_waiting",
            "Resumes waiting for an accelerator",
            value=data["waiting"],
        )
        seconds = GaugeMetricFamily(
            "jupyter_pause_gpu_seconds",
            "GPU-seconds over all known sessions: allocated, active (cells running), released",
            labels=["kind"],
        )
        for kind in ("allocated", "active", "released"):
            seconds.add_metric([kind], data[f"gpu_seconds_{kind}"])
        yield seconds


def register(snapshot: Callable[[], dict[str, Any]]) -> SnapshotCollector:
    collector = SnapshotCollector(snapshot)
    REGISTRY.register(collector)
    return collector


def unregister(collector: SnapshotCollector) -> None:
    REGISTRY.unregister(collector)
