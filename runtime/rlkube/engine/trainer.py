"""What every distributed engine on the train ranks shares: one training step, publishing, checkpoints.

I/O. A :class:`TrainContext` is one train rank's world: its TRAIN policy (DDP-wrapped when there
are several ranks), the command channel, its weight publisher, the run directory, and on rank 0
the coordinator. Rank 0 runs an engine (:mod:`~rlkube.engine.sync_engine`,
:mod:`~rlkube.engine.async_engine`, :mod:`~rlkube.engine.eval_engine`) built on
:class:`RankZeroEngine`; every other rank runs :func:`follow`: wait for a command, pull its
shard, train (DDP all-reduces the gradients), publish its copy when the strategy is Sharded.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from tensordict import TensorDict

from rlkube.buffer.processors import apply_processors, value_fn_of
from rlkube.contract import CoordinatorPhase
from rlkube.coordinator.client import CoordinatorError, PolicyGroupClient
from rlkube.coordinator.state import Coordinator, EngineStatus
from rlkube.coordinator.wire import batch_from_proto
from rlkube.data.replay_buffer import ReplayBuffer
from rlkube.data.rollout_buffer import EpochBatch
from rlkube.engine.checkpoint import POLICY_FILE, CheckpointStore, TrainerProgress
from rlkube.engine.disk import DiskFault, is_disk_error
from rlkube.engine.failure import NON_FINITE_WEIGHTS, NonFiniteWeights, non_finite_parameter, write_failure
from rlkube.engine.ranks import Command, Op, RankChannel
from rlkube.engine.report import EpochRecord, RunObserver, RunSummary, notify
from rlkube.engine.run_paths import RunPaths
from rlkube.engine.tracker import RunTracker
from rlkube.policy.base import BasePolicy, unwrap
from rlkube.spec import BufferType, Engine, RLJob, WeightStrategy
from rlkube.weights.layout import StateDict
from rlkube.weights.resident import aliases

logger = logging.getLogger(__name__)


class Publisher(Protocol):
    """How a train rank publishes: ``WeightPublisher`` in a pod, ``InProcessPublisher`` in process."""

    incarnation: str

    def send(
        self,
        state_dict: StateDict,
        *,
        version: int | None = None,
        fingerprint: Mapping[str, float] | None = None,
    ) -> int: ...

    def keep_resident(self, tensors: StateDict) -> bool:
        """Keep the trainer's own tensors where a publish reads them (zero-copy); False: it copies."""
        ...

    def wait_writable(self) -> None:
        """Block until the trainer may update its tensors again (after a zero-copy publish)."""
        ...


class Stopped(Exception):
    """The process was asked to stop (SIGTERM) while the engine waited."""


@dataclass
class TrainContext:
    job: RLJob
    policy: BasePolicy
    channel: RankChannel
    paths: RunPaths
    publisher: Publisher | None  # rank 0 always; other ranks for Sharded
    coordinator: Coordinator | None = None  # rank 0
    client: PolicyGroupClient | None = None  # other ranks: pulls shards from rank 0
    observers: Sequence[RunObserver] = ()
    stop: threading.Event = field(default_factory=threading.Event)
    clock: Callable[[], float] = time.monotonic
    #: buffer.type replay: this rank's own ring of transitions (each rank samples its share)
    replay: ReplayBuffer | None = None
    #: Whether the publisher was offered the policy's tensors (once, after the first publish).
    residency_offered: bool = False

    def __post_init__(self) -> None:
        spec = self.job.spec
        if spec.buffer.type is BufferType.REPLAY and self.replay is None:
            self.replay = ReplayBuffer(spec.buffer.capacity, seed=spec.train.seed + self.rank)

    @property
    def rank(self) -> int:
        return self.channel.rank

    @property
    def world_size(self) -> int:
        return self.channel.world_size

    @property
    def sharded(self) -> bool:
        return self.job.spec.policy.weight_buffer.strategy is WeightStrategy.SHARDED


def train_step(ctx: TrainContext, shard: TensorDict) -> dict[str, float]:
    """``update_dataset`` + ``train`` on this rank's shard; the figures it returned or logged.

    On-policy the policy gets the shard's ``[rows, T]`` fragments, after ``spec.buffer.processors``
    (``rlkube.buffer.processors``); with a replay buffer it gets the transitions
    ``policy.replay_sample_size`` asks for, sampled from this rank's ring.
    """
    policy = ctx.policy
    if ctx.replay is not None:
        ctx.replay.extend(shard)
        shard = ctx.replay.sample(
            policy.replay_sample_size(ctx.job.spec.train.steps_per_epoch, ctx.world_size)
        )
    # A zero-copy publish may still be moving the tensors off the flipped slot: wait before any
    # policy code runs (a user's update_dataset may update buffers such as running statistics).
    if ctx.publisher is not None:
        ctx.publisher.wait_writable()
    processors = ctx.job.spec.buffer.processors
    if processors:  # what RLightning's rollout buffer adds (advantages, returns, transitions)
        shard = apply_processors(processors, shard, value_fn=value_fn_of(policy))
    policy.update_dataset(shard)
    return {**numbers_of(policy.train()), **policy.pop_metrics()}


def own_tensors(policy: BasePolicy) -> StateDict:
    """The tensors the policy trains, the objects themselves: what a zero-copy publish keeps in shm."""
    return {name: unwrap(model).state_dict(keep_vars=True) for name, model in policy.model_list}


def keep_resident(publisher: Publisher, policy: BasePolicy) -> None:
    """After the first publish: let the publisher keep the policy's tensors in its slot.

    Only where ``get_trainable_parameters`` hands out those very tensors (BasePolicy's does; a
    policy that returns copies is published by copy, as before).
    """
    tensors = own_tensors(policy)
    if aliases(policy.get_trainable_parameters(), tensors):
        publisher.keep_resident(tensors)


def offer_residency(ctx: TrainContext) -> None:
    """:func:`keep_resident` once per process, after its first publish (later sends only flip)."""
    if ctx.publisher is not None and not ctx.residency_offered:
        ctx.residency_offered = True
        keep_resident(ctx.publisher, ctx.policy)


def numbers_of(returned: object) -> dict[str, float]:
    """The numeric entries of what ``train()`` returned (RLightning policies return a dict or None). Pure."""
    if not isinstance(returned, dict):
        return {}
    numbers: dict[str, float] = {}
    for key, value in returned.items():
        try:
            numbers[str(key)] = float(value)
        except (TypeError, ValueError):
            continue
    return numbers


def policy_file(path: str) -> Path:
    """``checkpoint.path`` may name a policy file or a checkpoint directory (its policy file)."""
    target = Path(path)
    return target / POLICY_FILE if target.is_dir() else target


def publish_followers(ctx: TrainContext, version: int) -> None:
    """Every rank but 0: commit this rank's copy of ``version`` (Sharded), then meet rank 0."""
    if ctx.sharded and ctx.publisher is not None:
        ctx.publisher.send(ctx.policy.get_trainable_parameters(), version=version)
        offer_residency(ctx)
    if ctx.sharded:
        ctx.channel.barrier()


def follow(ctx: TrainContext) -> None:
    """Ranks > 0: take rank 0's (restored) state, then train on every step it commands, until stop."""
    assert ctx.client is not None
    ctx.channel.share_state(ctx.policy, None)  # the counterpart of every engine's first collective
    while True:
        command = ctx.channel.receive()
        if command.op is Op.STOP:
            return
        shard = pull_shard(ctx, command)
        train_step(ctx, shard)
        publish_followers(ctx, command.version)


def pull_shard(ctx: TrainContext, command: Command) -> TensorDict:
    assert ctx.client is not None
    while True:
        try:
            message = ctx.client.pull_shard(
                serial=command.serial, rank=ctx.rank, world_size=ctx.world_size, wait_seconds=20.0
            )
            return batch_from_proto(message.batch).clone()
        except CoordinatorError as exc:
            if exc.code is not None and exc.code.name == "UNAVAILABLE" and not ctx.stop.is_set():
                continue
            raise


class RankZeroEngine:
    """The parts of rank 0's loop every engine shares (see the module docstring)."""

    #: How long an evaluation may wait for an eval worker before it is skipped.
    EVALUATION_TIMEOUT = 120.0

    def run(self) -> RunSummary:
        """Drive the job to its end; each engine (sync, async, eval) defines its loop."""
        raise NotImplementedError

    def __init__(self, ctx: TrainContext) -> None:
        assert ctx.coordinator is not None
        assert ctx.publisher is not None
        self.ctx = ctx
        self.spec = ctx.job.spec
        self.coordinator = ctx.coordinator
        self.publisher = ctx.publisher
        self.store = CheckpointStore(ctx.paths.checkpoints, keep=self.spec.checkpoint.keep)
        self.serial = 0
        self.fragments_trained = 0  # by this incarnation
        self.fragments_dropped = 0  # as stale (async), by this incarnation
        self.dropped_by_incarnation: dict[str, int] = {}
        #: From the checkpoint resumed: fragments trained before it, in total and per incarnation.
        self.trained_before = 0
        self.trained_by_incarnation: dict[str, int] = {}
        self.fingerprint_checks: list[tuple[int, bool]] = []  # (version, every report consistent)

    # ------------------------------------------------------------------ steps
    def train_on(self, shard: TensorDict, *, version: int) -> dict[str, float]:
        """One synchronous step on every rank: command, train, publish ``version``."""
        self.ctx.channel.send(Command(Op.TRAIN, self.serial, version))
        metrics = train_step(self.ctx, shard)
        self.publish(version)
        self.serial += 1
        return metrics

    def offer(self, batch: Any) -> TensorDict:
        """Hand ``batch`` to the ranks for the coming step; rank 0's own share."""
        return self.coordinator.offer_shards(batch, serial=self.serial)

    def publish(self, version: int) -> None:
        """Commit ``version`` on every serving rank, then announce it from rank 0."""
        state = self.ctx.policy.get_trainable_parameters()
        bad = non_finite_parameter(state)
        if bad is not None:  # never publish NaN/Inf: every eval worker would act on it
            epoch = (self.coordinator.snapshot.epoch or 0) + (1 if version else 0)
            message = (
                f"{NON_FINITE_WEIGHTS}: after epoch {epoch} parameter {bad} holds NaN or Inf; "
                f"version {version} was not published"
            )
            write_failure(self.ctx.paths.checkpoints, reason=NON_FINITE_WEIGHTS, message=message)
            self.coordinator.finish(
                phase=CoordinatorPhase.FAILED, message=message, failure_reason=NON_FINITE_WEIGHTS
            )
            raise NonFiniteWeights(message)
        if self.ctx.sharded:
            self.ctx.channel.barrier()  # the other ranks committed their copies
        fingerprint = self.ctx.policy.get_param_fingerprint()
        self.publisher.send(state, version=version, fingerprint=fingerprint)
        self.coordinator.published(
            version=version, fingerprint=fingerprint, incarnation=self.publisher.incarnation
        )
        offer_residency(self.ctx)

    # ------------------------------------------------------------------ waiting
    def wait_batch(self, what: str, *, step: int | None = None) -> Any:
        """The next epoch's worth of fragments; keeps the status message honest while waiting.

        ``step``: the step that takes them (async; sync: the open epoch), for the journal.
        """
        waited = 0.0
        while True:
            if self.ctx.stop.is_set():
                raise Stopped(what)
            batch = self.coordinator.wait_batch(timeout=1.0, step=step)
            failed = self.coordinator.journal_error
            if failed is not None:  # nothing can be acknowledged any more: end the run, one line
                if is_disk_error(failed):
                    journal = self.coordinator.journal
                    where = failed.filename or (journal.directory if journal is not None else "?")
                    raise DiskFault("checkpoint journal", where, failed) from failed
                raise failed
            if batch is not None:
                if waited > 5:
                    self.coordinator.update(EngineStatus(message=""))
                return batch
            waited += 1.0
            if waited >= 5 and self.coordinator.live_workers() == 0:
                evicted = len(self.coordinator.refusals.evicted)
                why = f"; {evicted} eval pods evicted for refused fragments" if evicted else ""
                self.coordinator.update(EngineStatus(message=f"waiting for eval workers ({what}){why}"))

    def evaluate(self, *, epoch: int, version: int) -> float | None:
        episodes = self.spec.train.eval_episodes
        returns = self.coordinator.evaluate(
            epoch=epoch, version=version, episodes=episodes, timeout=self.EVALUATION_TIMEOUT
        )
        if not returns:
            logger.warning("epoch %d: no eval worker ran the evaluation in time; skipped", epoch)
            return None
        return sum(returns) / len(returns)

    def check_fingerprints(self, version: int) -> bool | None:
        """Did every eval worker that reported ``version`` load it consistently? None: nobody reported."""
        verdict = self.coordinator.version_consistency(version)
        if verdict is not None:
            self.fingerprint_checks.append((version, verdict))
        return verdict

    # ------------------------------------------------------------------ bookkeeping
    def restore(self) -> TrainerProgress:
        """Rank 0 resumes from the newest valid checkpoint; every rank gets the same state."""
        progress = TrainerProgress()
        if self.spec.checkpoint.resume:
            checkpoint = self.store.latest()
            if checkpoint is not None:
                progress = self.store.load(checkpoint, self.ctx.policy)
                logger.info("resumed from %s (epoch %d)", checkpoint.path, progress.epoch)
            if self.store.moved_aside:
                moved = ", ".join(str(target) for _, target in self.store.moved_aside)
                self.coordinator.update(EngineStatus(message=f"corrupt checkpoints moved aside: {moved}"))
        if progress.epoch == 0 and self.spec.checkpoint.path:
            self.ctx.policy.load_checkpoint(str(policy_file(self.spec.checkpoint.path)))
            logger.info("initial weights from %s", self.spec.checkpoint.path)
        self.trained_before = int(progress.extra.get("fragments_trained", 0))
        self.trained_by_incarnation = dict(progress.extra.get("trained_by_incarnation", {}))
        self.dropped_by_incarnation = dict(progress.extra.get("dropped_by_incarnation", {}))
        self.ctx.channel.share_state(self.ctx.policy, progress)
        return progress

    def tracker(self, progress: TrainerProgress) -> RunTracker:
        tracker = RunTracker(
            job=self.ctx.job.name,
            max_epochs=self.spec.train.max_epochs,
            target_return=self.spec.train.target_return,
            progress=progress,
            now=self.ctx.clock(),
        )
        notify(self.ctx.observers, "on_start", tracker.start())
        self.coordinator.update(
            EngineStatus(
                epoch=tracker.epoch,
                env_steps=tracker.env_steps,
                last_return=tracker.recent_return,
                episodes=len(tracker.episodes),
                eval_return=tracker.last_eval,
            )
        )
        return tracker

    def record_epoch(
        self,
        tracker: RunTracker,
        batch: EpochBatch,
        *,
        version: int,
        metrics: dict[str, float],
        consistent: bool | None,
        eval_return: float | None,
    ) -> bool:
        """Book a trained step (observers, status, checkpoint when due); True once the target is reached."""
        record = tracker.epoch_done(
            env_steps=batch.env_steps,
            weight_version=version,
            episode_returns=batch.episode_returns,
            episode_lengths=batch.episode_lengths,
            metrics=metrics,
            fingerprints_consistent=consistent,
            eval_return=eval_return,
            now=self.ctx.clock(),
        )
        self.epoch_done(tracker, record)
        return tracker.target_reached

    def epoch_done(self, tracker: RunTracker, record: EpochRecord) -> None:
        notify(self.ctx.observers, "on_epoch", record)
        self.coordinator.update(
            EngineStatus(
                phase=CoordinatorPhase.RUNNING,
                epoch=record.epoch,
                env_steps=record.env_steps,
                last_return=record.recent_return,
                episodes=record.episodes_total,
                eval_return=tracker.last_eval,
                fingerprints_consistent=tracker.consistent,
            )
        )
        interval = self.spec.train.save_interval
        if interval and record.epoch % interval == 0:
            self.save(tracker)

    def save(self, tracker: RunTracker) -> Path:
        progress = tracker.progress(now=self.ctx.clock())
        counts = {  # what the summary adds up over every incarnation of the run
            "fragments_trained": self.trained_before + self.fragments_trained,
            "trained_by_incarnation": self.trained_counts(),
            "dropped_by_incarnation": self.dropped_counts(),
        }
        progress = replace(progress, extra={**progress.extra, **counts})
        self.coordinator.durable()  # the steps the checkpoint holds are on file in the journal
        path = self.store.save(self.ctx.policy, progress)
        self.coordinator.checkpointed(epoch=progress.epoch)  # journalled fragments it holds can go
        return path

    def trained_counts(self) -> dict[str, int]:
        return {**self.trained_by_incarnation, self.coordinator.incarnation: self.fragments_trained}

    def dropped_counts(self) -> dict[str, int]:
        """Fragments dropped as stale (async) by each incarnation, in the surviving history."""
        return {**self.dropped_by_incarnation, self.coordinator.incarnation: self.fragments_dropped}

    def incarnation_counts(self) -> dict[str, Any]:
        """Acknowledged, trained and dropped fragments over every incarnation (from the journal).

        In the surviving history every acknowledged fragment is trained on, dropped as stale,
        quarantined or still queued when the run ends (async) exactly once:
        ``fragments_acknowledged_total == fragments_trained_total + fragments_dropped_total +
        fragments_quarantined_total + fragments_queued_at_end``.
        """
        journal = self.coordinator.journal
        if journal is None:
            return {}
        acknowledged, queued = self.coordinator.acknowledged_and_queued()
        trained = self.trained_counts()
        dropped = self.dropped_counts()
        return {
            "incarnations": {
                name: {
                    "acknowledged": acknowledged.get(name, 0),
                    "trained": trained.get(name, 0),
                    "dropped_stale": dropped.get(name, 0),
                }
                for name in sorted(set(acknowledged) | set(trained))
            },
            "fragments_acknowledged_total": sum(acknowledged.values()),
            "fragments_trained_total": self.trained_before + self.fragments_trained,
            "fragments_dropped_total": sum(dropped.values()),
            "fragments_queued_at_end": queued,
            "fragments_replayed": self.coordinator.replayed,
            "fragments_quarantined_total": journal.quarantined(),
        }

    def finish(
        self, tracker: RunTracker, *, stop_reason: str, details: dict[str, Any], episodes: int | None = None
    ) -> RunSummary:
        """Stop the other ranks, write the last checkpoint, the marker, the summary; tell the workers.

        ``episodes``: what the summary counts as episodes when not the training episodes (eval engine).
        """
        self.ctx.channel.send(Command(Op.STOP))
        paths = self.ctx.paths.as_dict()
        if self.spec.engine is not Engine.EVAL:
            # The last checkpoint holds the final progress, the evaluation after the last epoch included.
            latest = self.store.latest()
            current = (
                latest is not None
                and latest.progress.epoch == tracker.epoch
                and len(latest.progress.evaluations) == len(tracker.evaluations)
            )
            paths["checkpoint"] = str(latest.path if current and latest is not None else self.save(tracker))
        checks = self.fingerprint_checks
        details = {**details, **self.incarnation_counts(), **self.coordinator.refusal_summary()}
        if self.store.moved_aside:  # named in summary.json and by `rlkube run`
            details = {**details, "corrupt_checkpoints": [str(t) for _, t in self.store.moved_aside]}
        first = self.coordinator.first_registration_at
        if first is not None:  # start-up inside wall_seconds: eval workers importing, envs starting
            details = {**details, "seconds_to_first_worker": round(max(0.0, first - tracker.started), 3)}
        summary = tracker.summary(stop_reason=stop_reason, now=self.ctx.clock(), paths=paths)
        summary = RunSummary(
            **{
                **summary.__dict__,
                "engine": self.spec.engine.value,
                "fingerprint_checks": len(checks),
                "fingerprints_consistent": tracker.consistent and all(ok for _, ok in checks),
                "details": details,
                "episodes": summary.episodes if episodes is None else episodes,
            }
        )
        self.store.mark_complete(summary.to_json())
        # Leases answer STOP from here: eval workers idle before the launcher or the operator
        # stops them, instead of waiting out a long poll while observers draw their plots.
        self.coordinator.finish(phase=CoordinatorPhase.COMPLETE, message=f"finished: {stop_reason}")
        notify(self.ctx.observers, "on_finish", summary)
        return summary
