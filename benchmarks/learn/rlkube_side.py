"""rlkube's side of the learn bench: the reference job, in-process, for one seed and a budget."""

from __future__ import annotations

import math
import tempfile
import time
from pathlib import Path

from rlkube.engine.report import EpochRecord, RunStart, RunSummary
from rlkube.engine.run_paths import RunPaths
from rlkube.launch.in_process import InProcessRun
from rlkube.policy import POLICIES
from rlkube.spec import RLJob

from benchmarks.learn.curve import Curve, steps_to_target


def budgeted(job: RLJob, *, seed: int, budget: int, stop_at_target: bool) -> RLJob:
    """The job with ``seed``, ``maxEpochs`` covering ``budget`` env steps, no eval episodes."""
    spec = job.spec
    train = spec.train.model_copy(
        update={
            "seed": seed,
            "max_epochs": max(1, math.ceil(budget / spec.train.steps_per_epoch)),
            "eval_interval": 0,
            "save_interval": 0,
            "target_return": spec.train.target_return if stop_at_target else None,
        }
    )
    return job.model_copy(update={"spec": spec.model_copy(update={"train": train})})


class _Episodes:
    def __init__(self, curve: Curve) -> None:
        self.curve = curve

    def on_start(self, start: RunStart) -> None:
        pass

    def on_epoch(self, record: EpochRecord) -> None:
        self.curve.episodes.extend((steps, ret) for steps, ret, _ in record.new_episodes)
        self.curve.env_steps = record.env_steps

    def on_finish(self, summary: RunSummary) -> None:
        pass


def run_rlkube(
    job: RLJob, *, seed: int, budget: int, stop_at_target: bool, into: Curve | None = None
) -> Curve:
    """``rlkube run --in-process`` of the budgeted job; the curve holds raw episode returns.

    ``into``: filled as the run goes (another thread may read it), else a new one.
    """
    run = budgeted(job, seed=seed, budget=budget, stop_at_target=stop_at_target)
    curve = into if into is not None else Curve(side="rlkube", seed=seed)
    with tempfile.TemporaryDirectory(prefix="rlkube-learn-") as tmp:
        paths = RunPaths(Path(tmp)).create()
        engine = InProcessRun(
            run, POLICIES.get(run.spec.policy.type), paths=paths, observers=[_Episodes(curve)]
        )
        started = time.monotonic()
        engine.run()
        curve.wall_seconds = time.monotonic() - started
    target = job.spec.train.target_return
    if target is not None:
        curve.steps_to_target = steps_to_target(curve.episodes, target)
    return curve
