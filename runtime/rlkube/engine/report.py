"""What a run reports: per-epoch records, the final summary, and the observers that write them down.

The records, :func:`recent_mean` and :func:`epoch_scalars` are pure. The observers do I/O:
:class:`TensorBoardLog` (event files; ``rlkube.engine.loggers`` adds Weights & Biases under the
same names), :class:`LearningCurve` (a PNG, matplotlib's Agg backend) and :class:`SummaryFiles`
(``summary.json``, possibly in several places). Engines call ``on_start``, ``on_epoch`` and
``on_finish`` on every observer they are given; the live progress display (``rlkube.launch``)
is one more observer.

Metric names, identical in every logging backend (:func:`epoch_scalars`; x axis: env steps):
``charts/episodic_return`` and ``charts/episodic_length`` (one point per finished episode),
``charts/mean_return_20``, ``charts/SPS``, ``charts/weight_version``, ``eval/mean_return``,
``weights/fingerprints_consistent``, and every metric the policy logged (PPO: ``losses/*``,
``charts/learning_rate``).
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from rlkube.engine.disk import DiskFault, as_disk_fault

logger = logging.getLogger(__name__)

#: "Mean return" everywhere means the mean of the last this-many finished training episodes.
RECENT_EPISODES = 20


def recent_mean(
    returns: Sequence[float], window: int = RECENT_EPISODES, *, require_full: bool = False
) -> float | None:
    """Mean of the last ``window`` returns (of fewer while fewer finished); None without any.

    With ``require_full`` it stays None until ``window`` episodes finished (the target check).
    """
    if not returns or (require_full and len(returns) < window):
        return None
    tail = returns[-window:]
    return sum(tail) / len(tail)


@dataclass(frozen=True)
class RunStart:
    job: str
    max_epochs: int
    start_epoch: int  # epochs already completed (0, or the resumed checkpoint's)
    env_steps: int
    weight_version: int
    episodes: tuple[tuple[int, float, int], ...] = ()  # history restored from a checkpoint
    evaluations: tuple[tuple[int, int, float], ...] = ()
    target_return: float | None = None


@dataclass(frozen=True)
class EpochRecord:
    """One finished epoch, as every observer sees it."""

    epoch: int  # epochs completed, 1-based
    max_epochs: int
    env_steps: int
    weight_version: int
    steps_per_second: float
    recent_return: float | None
    episodes_total: int
    new_episodes: tuple[tuple[int, float, int], ...]  # (env steps, return, length) finished this epoch
    metrics: dict[str, float] = field(default_factory=dict)
    eval_return: float | None = None
    fingerprints_consistent: bool | None = None
    wall_seconds: float = 0.0


@dataclass(frozen=True)
class RunSummary:
    """The end of a run; ``summary.json`` is :meth:`to_json`."""

    job: str
    final_return: float | None  # mean of the last 20 training episodes
    env_steps: int
    epochs: int
    wall_seconds: float  # this process's run
    weight_version: int
    stop_reason: str  # max_epochs | target_return | evaluated
    fingerprints_consistent: bool
    eval_return: float | None = None
    episodes: int = 0
    target_return: float | None = None
    env_steps_to_target: int | None = None
    total_wall_seconds: float | None = None  # over every resumed run of this job
    resumed_from_epoch: int | None = None
    engine: str = "in-process"
    already_complete: bool = False  # a restart found the completion marker and trained nothing
    paths: dict[str, str] = field(default_factory=dict)
    #: versions whose eval-side fingerprints were compared with the trainer's (all must match)
    fingerprint_checks: int = 0
    #: engine-specific figures (weight wait fraction, staleness, ...), written at the top level
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(data.pop("details"))
        for key in ("final_return", "eval_return"):
            if isinstance(data[key], float) and not math.isfinite(data[key]):
                data[key] = None
        return data


class RunObserver(Protocol):
    def on_start(self, start: RunStart) -> None: ...

    def on_epoch(self, record: EpochRecord) -> None: ...

    def on_finish(self, summary: RunSummary) -> None: ...


@dataclass(frozen=True)
class Scalar:
    """One logged point: ``tag`` (e.g. ``charts/SPS``) at ``step`` env steps."""

    tag: str
    value: float
    step: int


def epoch_scalars(record: EpochRecord) -> list[Scalar]:
    """Every point an epoch logs, named once for every backend (TensorBoard, W&B). Pure."""
    step = record.env_steps
    points: list[Scalar] = []
    for steps, ret, length in record.new_episodes:
        points.append(Scalar("charts/episodic_return", ret, steps))
        points.append(Scalar("charts/episodic_length", length, steps))
    if record.recent_return is not None:
        points.append(Scalar("charts/mean_return_20", record.recent_return, step))
    points.append(Scalar("charts/SPS", record.steps_per_second, step))
    points.append(Scalar("charts/weight_version", record.weight_version, step))
    if record.eval_return is not None:
        points.append(Scalar("eval/mean_return", record.eval_return, step))
    if record.fingerprints_consistent is not None:
        points.append(Scalar("weights/fingerprints_consistent", float(record.fingerprints_consistent), step))
    points += [Scalar(key, value, step) for key, value in record.metrics.items() if math.isfinite(value)]
    return points


class TensorBoardLog:
    """TensorBoard event files in ``log_dir``."""

    def __init__(self, log_dir: str | os.PathLike[str]) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = Path(log_dir)
        self._writer = SummaryWriter(log_dir=str(self.log_dir))

    def on_start(self, start: RunStart) -> None:
        self._writer.add_text("job", f"{start.job}: from epoch {start.start_epoch} of {start.max_epochs}")

    def on_epoch(self, record: EpochRecord) -> None:
        for point in epoch_scalars(record):
            self._writer.add_scalar(point.tag, point.value, point.step)
        self._writer.flush()

    def on_finish(self, summary: RunSummary) -> None:
        self._writer.close()


class LearningCurve:
    """Episode returns against env steps (with the 20-episode mean, evaluations and the target) as a PNG."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.episodes: list[tuple[int, float, int]] = []
        self.evaluations: list[tuple[int, float]] = []
        self.target: float | None = None
        self.title = ""
        self._started = False

    def on_start(self, start: RunStart) -> None:
        self._started = True
        self.episodes = list(start.episodes)
        self.evaluations = [(steps, ret) for _, steps, ret in start.evaluations]
        self.target = start.target_return
        self.title = start.job

    def on_epoch(self, record: EpochRecord) -> None:
        self.episodes.extend(record.new_episodes)
        if record.eval_return is not None:
            self.evaluations.append((record.env_steps, record.eval_return))

    def on_finish(self, summary: RunSummary) -> None:
        if not self._started:  # nothing ran (e.g. the job was already complete): keep the old plot
            return
        if summary.eval_return is not None and not any(s == summary.env_steps for s, _ in self.evaluations):
            self.evaluations.append((summary.env_steps, summary.eval_return))
        self.write()

    def write(self) -> Path:
        import matplotlib

        matplotlib.use("Agg", force=True)
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
        try:
            if self.episodes:
                steps = [s for s, _, _ in self.episodes]
                returns = [r for _, r, _ in self.episodes]
                ax.plot(steps, returns, ".", alpha=0.25, markersize=3, label="episode return")
                means = [recent_mean(returns[: i + 1]) or 0.0 for i in range(len(returns))]
                ax.plot(steps, means, "-", linewidth=2, label=f"mean of last {RECENT_EPISODES}")
            if self.evaluations:
                ax.plot(*zip(*self.evaluations, strict=True), "s", label="evaluation (greedy)")
            if self.target is not None:
                ax.axhline(self.target, linestyle="--", color="grey", label=f"target {self.target:g}")
            ax.set_xlabel("env steps")
            ax.set_ylabel("return")
            ax.set_title(self.title)
            ax.grid(alpha=0.3)
            if self.episodes or self.evaluations:
                ax.legend(loc="lower right")
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp.png")
            fig.savefig(tmp)
            tmp.replace(self.path)
        finally:
            plt.close(fig)
        return self.path


class SummaryFiles:
    """``summary.json`` written to each of ``paths`` at the end of the run."""

    def __init__(self, *paths: str | os.PathLike[str] | None) -> None:
        self.paths = [Path(p) for p in paths if p is not None]

    def on_start(self, start: RunStart) -> None:
        pass

    def on_epoch(self, record: EpochRecord) -> None:
        pass

    def on_finish(self, summary: RunSummary) -> None:
        text = json.dumps(summary.to_json(), indent=2)
        for path in self.paths:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_text(text + "\n")
            tmp.replace(path)


def notify(observers: Sequence[RunObserver], event: str, payload: Any) -> None:
    """Call ``observer.<event>(payload)`` on each; a failing observer is logged, never fatal.

    Except a disk fault (no space, read-only, no permission): that ends the run, as a
    :class:`~rlkube.engine.disk.DiskFault` naming the observer's output, after every observer had
    its turn (so a full disk under TensorBoard still lets the summary try).
    """
    fault: DiskFault | None = None
    for observer in observers:
        try:
            getattr(observer, event)(payload)
        except Exception as exc:
            found = as_disk_fault(exc, what=_output_of(observer), path=_where(observer))
            if found is None:
                logger.exception("%s.%s failed", type(observer).__name__, event)
            elif fault is None:
                fault = found
    if fault is not None:
        raise fault


def _where(observer: object) -> str:
    for name in ("log_dir", "path"):
        if (value := getattr(observer, name, None)) is not None:
            return str(value)
    paths = getattr(observer, "paths", None)
    return str(paths[0]) if paths else ""


def _output_of(observer: object) -> str:
    return {
        "TensorBoardLog": "TensorBoard event file",
        "LearningCurve": "learning curve",
        "SummaryFiles": "summary",
    }.get(type(observer).__name__, f"{type(observer).__name__} output")
