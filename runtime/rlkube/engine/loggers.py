"""The logging backends of ``spec.log.backends``: TensorBoard and Weights & Biases, one name for each metric.

I/O. :func:`backend_observers` builds the observers train rank 0 (or ``rlkube run`` in one
process) hands its engine. Both write the points of :func:`rlkube.engine.report.epoch_scalars`,
so a metric has the same name everywhere; W&B plots them against ``env_steps`` (its own step
counter must only grow, and episodes finish out of order across workers).

W&B is optional (``pip install 'rlkube[wandb]'``). Its run lives in the run directory
(``wandb/``): offline runs stay there for ``wandb sync``; a restarted rank 0 resumes the same run
(its id is kept in ``wandb-run-id``).
"""

from __future__ import annotations

import os
import secrets
from collections import defaultdict
from pathlib import Path
from typing import Any

from rlkube.engine.report import (
    EpochRecord,
    LearningCurve,
    RunObserver,
    RunStart,
    RunSummary,
    SummaryFiles,
    TensorBoardLog,
    epoch_scalars,
)
from rlkube.engine.run_paths import RunPaths
from rlkube.spec import LogBackend, LogSpec, RLJob, WandbSpec

#: The x axis of every W&B chart.
STEP_METRIC = "env_steps"
RUN_ID_FILE = "wandb-run-id"


class WandbLog:
    """A Weights & Biases run in ``run_dir``; started in ``on_start``, finished in ``on_finish``."""

    def __init__(
        self, run_dir: str | os.PathLike[str], *, job: str, spec: WandbSpec, config: dict[str, Any]
    ) -> None:
        try:
            import wandb
        except ImportError as exc:  # fail at start-up, not at the first epoch
            raise ImportError(
                "spec.log.backends names wandb, but the wandb package is not installed: "
                "pip install 'rlkube[wandb]' (or add wandb to the image)"
            ) from exc
        self._wandb = wandb
        self.run_dir = Path(run_dir)
        self.job = job
        self.spec = spec
        self.config = config
        self.run: Any = None

    def run_id(self) -> str:
        """The id of this run directory's W&B run (kept, so a restarted rank 0 resumes it)."""
        path = self.run_dir / RUN_ID_FILE
        try:
            return path.read_text().strip()
        except OSError:
            run_id = f"{self.job}-{secrets.token_hex(4)}"
            self.run_dir.mkdir(parents=True, exist_ok=True)
            path.write_text(run_id + "\n")
            return run_id

    def on_start(self, start: RunStart) -> None:
        settings: dict[str, Any] = {
            "project": self.spec.project or self.job,
            "entity": self.spec.entity,
            "name": self.job,
            "id": self.run_id(),
            "resume": "allow",
            "mode": os.environ.get("WANDB_MODE") or self.spec.mode.value,
            "dir": str(self.run_dir),
            "tags": list(self.spec.tags),
            "config": self.config,
        }
        self.run = self._wandb.init(**settings)
        self.run.define_metric(STEP_METRIC)
        self.run.define_metric("*", step_metric=STEP_METRIC)

    def on_epoch(self, record: EpochRecord) -> None:
        if self.run is None:
            return
        by_step: defaultdict[int, dict[str, float]] = defaultdict(dict)
        for point in epoch_scalars(record):
            by_step[point.step][point.tag] = float(point.value)
        for step in sorted(by_step):
            self.run.log({STEP_METRIC: step, **by_step[step]})

    def on_finish(self, summary: RunSummary) -> None:
        if self.run is None:
            return
        figures = {
            f"summary/{key}": value
            for key, value in summary.to_json().items()
            if isinstance(value, int | float) and not isinstance(value, bool)
        }
        self.run.summary.update(figures)
        self.run.finish()
        self.run = None


def run_observers(
    job: RLJob, paths: RunPaths, *, extra_summary: str | os.PathLike[str] | None = None
) -> list[RunObserver]:
    """What every run records, whoever runs it: the log backends, the learning curve and
    ``summary.json`` (also at ``extra_summary``); the caller adds how it shows progress."""
    observers = backend_observers(
        job.spec.log,
        run_dir=paths.run_dir,
        tensorboard_dir=paths.tensorboard,
        job=job.name,
        config=job.spec.model_dump(mode="json", by_alias=True, exclude_none=True),
    )
    return [*observers, LearningCurve(paths.plot), SummaryFiles(paths.summary, extra_summary)]


def backend_observers(
    log: LogSpec, *, run_dir: Path, tensorboard_dir: Path, job: str, config: dict[str, Any]
) -> list[RunObserver]:
    """One observer per active backend of ``log``, in its order."""
    observers: list[RunObserver] = []
    for backend in log.active_backends():
        if backend is LogBackend.TENSORBOARD:
            observers.append(TensorBoardLog(tensorboard_dir))
        elif backend is LogBackend.WANDB:
            observers.append(WandbLog(run_dir, job=job, spec=log.wandb, config=config))
    return observers
