"""A run's bookkeeping: env steps, episodes, the 20-episode mean, the target, fingerprint checks.

Pure: time comes in as arguments (``now`` from ``time.monotonic()``), nothing is read or written.
Every engine (in-process now, the distributed one on train rank 0 later) feeds it one call per
epoch and gets back the :class:`EpochRecord` observers see, the :class:`TrainerProgress` a
checkpoint stores, and the final :class:`RunSummary`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rlkube.engine.checkpoint import TrainerProgress
from rlkube.engine.report import EpochRecord, RunStart, RunSummary, recent_mean


class RunTracker:
    def __init__(
        self,
        *,
        job: str,
        max_epochs: int,
        target_return: float | None,
        progress: TrainerProgress,
        now: float,
    ) -> None:
        self.job = job
        self.max_epochs = max_epochs
        self.target_return = target_return
        self.start_epoch = progress.epoch
        self.epoch = progress.epoch
        self.env_steps = progress.env_steps
        self.weight_version = progress.weight_version
        self.episodes: list[tuple[int, float, int]] = list(progress.episodes)
        self.evaluations: list[tuple[int, int, float]] = list(progress.evaluations)
        self.env_steps_to_target = progress.env_steps_to_target
        self.previous_wall = progress.wall_seconds
        self.started = now
        self.last_epoch_end = now
        self.consistent = True
        self.fingerprint_checks = 0  # versions whose eval fingerprints were compared with the trainer's
        self.last_eval: float | None = self.evaluations[-1][2] if self.evaluations else None

    def start(self) -> RunStart:
        return RunStart(
            job=self.job,
            max_epochs=self.max_epochs,
            start_epoch=self.start_epoch,
            env_steps=self.env_steps,
            weight_version=self.weight_version,
            episodes=tuple(self.episodes),
            evaluations=tuple(self.evaluations),
            target_return=self.target_return,
        )

    @property
    def recent_return(self) -> float | None:
        return recent_mean([r for _, r, _ in self.episodes])

    @property
    def target_reached(self) -> bool:
        """The mean of the last 20 episodes (20 must have finished) is at least the target."""
        full = recent_mean([r for _, r, _ in self.episodes], require_full=True)
        return self.target_return is not None and full is not None and full >= self.target_return

    def epoch_done(
        self,
        *,
        env_steps: int,
        weight_version: int,
        episode_returns: Sequence[float],
        episode_lengths: Sequence[int],
        metrics: Mapping[str, float],
        fingerprints_consistent: bool | None,
        eval_return: float | None,
        now: float,
    ) -> EpochRecord:
        """Account for one epoch of ``env_steps`` steps that ended at ``now``."""
        self.epoch += 1
        self.env_steps += env_steps
        self.weight_version = weight_version
        new = tuple(
            (self.env_steps, float(r), int(n)) for r, n in zip(episode_returns, episode_lengths, strict=True)
        )
        self.episodes.extend(new)
        if fingerprints_consistent is not None:
            self.fingerprint_checks += 1
        if fingerprints_consistent is False:
            self.consistent = False
        if eval_return is not None:
            self.evaluations.append((self.epoch, self.env_steps, eval_return))
            self.last_eval = eval_return
        if self.env_steps_to_target is None and self.target_reached:
            self.env_steps_to_target = self.env_steps
        seconds = max(now - self.last_epoch_end, 1e-9)
        self.last_epoch_end = now
        return EpochRecord(
            epoch=self.epoch,
            max_epochs=self.max_epochs,
            env_steps=self.env_steps,
            weight_version=weight_version,
            steps_per_second=env_steps / seconds,
            recent_return=self.recent_return,
            episodes_total=len(self.episodes),
            new_episodes=new,
            metrics=dict(metrics),
            eval_return=eval_return,
            fingerprints_consistent=fingerprints_consistent,
            wall_seconds=now - self.started,
        )

    def record_evaluation(self, mean_return: float) -> None:
        """An evaluation after the last epoch's record (e.g. when the target stopped the run)."""
        self.evaluations.append((self.epoch, self.env_steps, mean_return))
        self.last_eval = mean_return

    def progress(self, *, now: float) -> TrainerProgress:
        return TrainerProgress(
            epoch=self.epoch,
            env_steps=self.env_steps,
            weight_version=self.weight_version,
            wall_seconds=self.previous_wall + (now - self.started),
            episodes=tuple(self.episodes),
            evaluations=tuple(self.evaluations),
            env_steps_to_target=self.env_steps_to_target,
        )

    def summary(self, *, stop_reason: str, now: float, paths: Mapping[str, str] | None = None) -> RunSummary:
        return RunSummary(
            job=self.job,
            final_return=self.recent_return,
            env_steps=self.env_steps,
            epochs=self.epoch,
            wall_seconds=now - self.started,
            weight_version=self.weight_version,
            stop_reason=stop_reason,
            fingerprints_consistent=self.consistent,
            fingerprint_checks=self.fingerprint_checks,
            eval_return=self.last_eval,
            episodes=len(self.episodes),
            target_return=self.target_return,
            env_steps_to_target=self.env_steps_to_target,
            total_wall_seconds=self.previous_wall + (now - self.started),
            resumed_from_epoch=self.start_epoch or None,
            paths=dict(paths or {}),
        )
