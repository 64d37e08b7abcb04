"""What a pod's ``/metrics`` reads: the coordinator on train rank 0, the counters of an eval worker.

I/O only in :func:`count_start` (a small file) and :func:`start_pod_metrics` (the HTTP server).
The series themselves are defined in :mod:`rlkube.metrics.series`; this module binds them to
the objects that hold the figures, read at scrape time, so the numbers are the ones
``GetStatus`` and ``summary.json`` report.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

from rlkube.contract import PodEnv, Role
from rlkube.coordinator.service import job_status
from rlkube.coordinator.state import Coordinator
from rlkube.metrics import series
from rlkube.metrics.server import MetricsServer, serve_metrics

logger = logging.getLogger(__name__)


def rank_zero_figures(coordinator: Coordinator) -> series.RankZeroFigures:
    """Train rank 0's figures, from the same view GetStatus answers with."""
    status = job_status(coordinator)
    in_flight, lags = coordinator.trajectory_counts()
    progress = coordinator.progress
    return series.RankZeroFigures(
        epoch=status.epoch,
        max_epochs=status.max_epochs,
        env_steps=status.env_steps,
        steps_per_second=status.steps_per_second,
        weight_version=status.weight_version,
        mean_return=status.last_return if status.HasField("last_return") else None,
        eval_workers=status.eval_workers,
        finished=status.finished,
        fragments_in_flight=in_flight,
        fragments_acknowledged=progress.fragments,
        fragments_dropped_stale=progress.dropped_stale,
        duplicate_pushes=progress.duplicates,
        fragments_refused=status.fragments_refused,
        fragments_quarantined=status.fragments_quarantined,
        eval_pods_evicted=status.workers_evicted,
        lag_counts=lags,
        node_lag={node.node_name: node.lag for node in status.nodes},
    )


def bind_coordinator(coordinator: Coordinator | None) -> None:
    """Rank 0's ``/metrics`` reads ``coordinator`` (None: unbind)."""
    series.RANK_ZERO_FIGURES.bind(None if coordinator is None else lambda: rank_zero_figures(coordinator))


def bind_eval_figures(source: Callable[[], series.EvalFigures] | None) -> None:
    """An eval worker's ``/metrics`` reads ``source`` (None: unbind)."""
    series.EVAL_FIGURES.bind(source)


#: In the pod's weight directory: how often each pod's process started (it outlives the container).
STARTS_FILE = "starts-{pod}.count"


def count_start(directory: Path, pod_name: str) -> int:
    """Count one more start of ``pod_name`` in ``directory``; returns the restarts before this one."""
    path = Path(directory) / STARTS_FILE.format(pod=pod_name)
    try:
        before = int(path.read_text().strip() or 0)
    except (OSError, ValueError):
        before = 0
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(f"{before + 1}\n")
        tmp.replace(path)
    except OSError as exc:
        logger.info("cannot count restarts in %s: %s", directory, exc)
    return before


def start_pod_metrics(env: PodEnv) -> MetricsServer | None:
    """Serve this pod's series on ``RLKUBE_METRICS_PORT`` (none when it is 0 or unset)."""
    if env.metrics_port <= 0:
        return None
    if env.role is Role.TRAIN:
        registries = [series.RANK_ZERO, series.TRAIN] if env.rank == 0 else [series.TRAIN]
    else:
        restarts = count_start(env.shm_dir, env.pod_name)
        series.RESTARTS.set(restarts)
        registries = [series.EVAL]
    return serve_metrics(registries, port=env.metrics_port)
