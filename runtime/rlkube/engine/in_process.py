"""The in-process engine: a TRAIN and an EVAL policy of the same class in one process.

I/O: runs environments, writes checkpoints and reports. Each epoch the EVAL side collects
``spec.fragments_per_epoch()`` fragments with weight version v (one :class:`RolloutWorker`; the
in-process engine ignores replica counts), they pass through the same :class:`RolloutBuffer`
the coordinator uses, TRAIN runs ``update_dataset`` + ``train`` on the single shard, and the
weights move with strategy ``None`` semantics (``eval.load_state_dict(train.get_trainable_parameters())``)
as version v+1, after which train and eval fingerprints are compared. Every ``evalInterval``
epochs (and after the last) a separate env group plays ``evalEpisodes`` greedy episodes; every
``saveInterval`` epochs (and at the end) a checkpoint is written. A run stops at ``maxEpochs``
or when the mean of the last 20 training episodes reaches ``targetReturn``.

With ``spec.buffer.type: replay`` the epoch's transitions go into a ring of ``buffer.capacity``
transitions and ``update_dataset`` receives ``stepsPerEpoch`` transitions sampled from it
(a flat ``[stepsPerEpoch]`` TensorDict) instead of the epoch's ``[rows, T]`` fragments.

``spec.engine: eval`` evaluates the policy stored at ``spec.checkpoint.path`` and trains nothing.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import torch

from rlkube.data.replay_buffer import ReplayBuffer
from rlkube.data.rollout_buffer import RolloutBuffer
from rlkube.engine.checkpoint import POLICY_FILE, CheckpointStore, TrainerProgress
from rlkube.engine.report import EpochRecord, RunObserver, RunSummary, notify
from rlkube.engine.rollout import RolloutWorker
from rlkube.engine.run_paths import RunPaths
from rlkube.engine.tracker import RunTracker
from rlkube.envs.group import EnvGroup
from rlkube.policy.base import BasePolicy, PolicyRole, seed_everything
from rlkube.spec import BufferType, Engine, PolicySpec, RLJob, WeightStrategy
from rlkube.weights.consistency import compare_fingerprints

logger = logging.getLogger(__name__)

#: Offset between the seeds of training envs and evaluation envs (so they never share episodes).
EVAL_SEED_OFFSET = 1_000_003


class EngineError(RuntimeError):
    """A job this engine cannot run as written (the message names the field)."""


def torch_threads(environ: Mapping[str, str]) -> int:
    """Intra-op threads for the in-process engine: ``OMP_NUM_THREADS`` if set, else 1.

    The loop alternates small inference calls, env steps and small updates in one process. On
    the 2-core machines here, two threads were no faster than one when idle and up to ~5x slower
    when other processes competed for the cores (15 CartPole epochs: 4.7 s vs 22 s).
    """
    try:
        return max(1, int(environ.get("OMP_NUM_THREADS", "1")))
    except ValueError:
        return 1


def with_strategy_none(policy: PolicySpec) -> PolicySpec:
    """The policy spec as the in-process engine runs it: weights move synchronously, no updater thread."""
    buffer = policy.weight_buffer.model_copy(update={"strategy": WeightStrategy.NONE})
    return policy.model_copy(update={"weight_buffer": buffer})


def _checkpoint_file(path: str) -> Path:
    """``checkpoint.path`` may name a policy file or a checkpoint directory."""
    target = Path(path)
    return target / POLICY_FILE if target.is_dir() else target


class InProcessEngine:
    """See the module docstring. Construct (validates the policy's settings), then :meth:`run`."""

    def __init__(
        self,
        job: RLJob,
        policy_cls: type[BasePolicy],
        *,
        paths: RunPaths,
        observers: Sequence[RunObserver] = (),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        spec = job.spec
        if spec.engine is Engine.ASYNC:
            raise EngineError(
                "spec.engine: got 'async', which needs the multi-process launcher; "
                "the in-process engine runs 'sync' and 'eval'"
            )
        self.job = job
        self.spec = spec
        self.paths = paths
        self.observers = list(observers)
        self.clock = clock
        self.policy_spec = with_strategy_none(spec.policy)
        # Constructing the policies validates their settings before any env starts.
        self.train_policy = policy_cls(self.policy_spec, PolicyRole.TRAIN)
        self.eval_policy = policy_cls(self.policy_spec, PolicyRole.EVAL)
        self.store = CheckpointStore(paths.checkpoints, keep=spec.checkpoint.keep)
        self._groups: list[EnvGroup] = []

    # ------------------------------------------------------------------ entry
    def run(self) -> RunSummary:
        previous_threads = torch.get_num_threads()
        torch.set_num_threads(torch_threads(os.environ))
        try:
            if self.spec.engine is Engine.EVAL:
                return self._evaluate_checkpoint()
            return self._train()
        finally:
            for group in self._groups:
                group.close()
            self.eval_policy.close()
            self.train_policy.close()
            torch.set_num_threads(previous_threads)

    # ------------------------------------------------------------------ training
    def _train(self) -> RunSummary:
        spec, train = self.spec, self.spec.train
        done = self.store.completion() if spec.checkpoint.resume else None
        if done is not None:
            logger.info("%s is complete (%s); not training again", self.job.name, self.store.complete_marker)
            return self._already_complete(done)
        seed_everything(train.seed)
        group = self._group(base_seed=train.seed)
        meta = group.meta
        self.train_policy.init_train(train, env_meta=meta)
        self.eval_policy.init_eval(None, env_meta=meta)
        progress = self._restore()
        worker = RolloutWorker(group, self.eval_policy)
        # A resumed run's envs start from new episodes, not from epoch 0's.
        worker.reset(seed=train.seed + 7919 * progress.epoch)
        self._publish(progress.weight_version)
        evaluator = (
            RolloutWorker(self._group(base_seed=train.seed + EVAL_SEED_OFFSET), self.eval_policy)
            if train.eval_interval > 0
            else None
        )
        per_epoch = spec.fragments_per_epoch()
        buffer = RolloutBuffer(fragments_per_epoch=per_epoch, capacity=per_epoch)
        replay = (
            ReplayBuffer(spec.buffer.capacity, seed=train.seed)
            if spec.buffer.type is BufferType.REPLAY
            else None
        )
        tracker = RunTracker(
            job=self.job.name,
            max_epochs=train.max_epochs,
            target_return=train.target_return,
            progress=progress,
            now=self.clock(),
        )
        notify(self.observers, "on_start", tracker.start())
        stop_reason = "max_epochs"
        saved_epoch = progress.epoch if progress.epoch else -1
        latest = self.store.directory / f"ckpt-{progress.epoch:06d}"
        if tracker.target_reached:
            stop_reason = "target_return"
        while stop_reason == "max_epochs" and tracker.epoch < train.max_epochs:
            record = self._epoch(tracker, worker, buffer, replay, evaluator)
            notify(self.observers, "on_epoch", record)
            if train.save_interval and record.epoch % train.save_interval == 0:
                latest = self.store.save(self.train_policy, tracker.progress(now=self.clock()))
                saved_epoch = record.epoch
            if tracker.target_reached:
                stop_reason = "target_return"
        if evaluator is not None and (not tracker.evaluations or tracker.evaluations[-1][0] != tracker.epoch):
            tracker.record_evaluation(self._evaluate(evaluator))
        if saved_epoch != tracker.epoch:
            latest = self.store.save(self.train_policy, tracker.progress(now=self.clock()))
        paths = {**self.paths.as_dict(), "checkpoint": str(latest)}
        summary = tracker.summary(stop_reason=stop_reason, now=self.clock(), paths=paths)
        self.store.mark_complete(summary.to_json())
        notify(self.observers, "on_finish", summary)
        return summary

    def _epoch(
        self,
        tracker: RunTracker,
        worker: RolloutWorker,
        buffer: RolloutBuffer,
        replay: ReplayBuffer | None,
        evaluator: RolloutWorker | None,
    ) -> EpochRecord:
        """Collect with version v, train, publish v+1, check fingerprints, evaluate when due."""
        train = self.spec.train
        epoch = tracker.epoch
        for index in range(buffer.fragments_per_epoch):
            buffer.add(f"e{epoch}-f{index}", worker.collect(train.fragment_length))
        batch = buffer.take_epoch()
        if replay is None:  # on-policy: this epoch's fragments, [rows, T]
            self.train_policy.update_dataset(batch.shard(0, 1))
        else:  # off-policy: transitions sampled from the ring, [stepsPerEpoch]
            replay.extend(batch.shard(0, 1))
            self.train_policy.update_dataset(replay.sample(train.steps_per_epoch))
        returned = self.train_policy.train()
        metrics = {**_numbers(returned), **self.train_policy.pop_metrics()}
        version = tracker.weight_version + 1
        self._publish(version)
        mismatches = compare_fingerprints(
            self.train_policy.get_param_fingerprint(), self.eval_policy.get_param_fingerprint()
        )
        consistent = not mismatches
        if mismatches:
            logger.warning(
                "epoch %d: eval weights differ from the trainer's after the update (%s)",
                epoch + 1,
                mismatches[0],
            )
        eval_return = None
        due = (epoch + 1) % max(train.eval_interval, 1) == 0 or epoch + 1 >= train.max_epochs
        if evaluator is not None and due:
            eval_return = self._evaluate(evaluator)
        return tracker.epoch_done(
            env_steps=batch.env_steps,
            weight_version=version,
            episode_returns=batch.episode_returns,
            episode_lengths=batch.episode_lengths,
            metrics=metrics,
            fingerprints_consistent=consistent,
            eval_return=eval_return,
            now=self.clock(),
        )

    def _evaluate(self, evaluator: RolloutWorker) -> float:
        """Greedy episodes on the evaluation envs, from the same seeds every time (comparable epochs)."""
        train = self.spec.train
        return evaluator.evaluate(train.eval_episodes, seed=train.seed + EVAL_SEED_OFFSET).mean_return

    def _group(self, *, base_seed: int) -> EnvGroup:
        group = EnvGroup.from_spec(self.spec.env, base_seed=base_seed)
        self._groups.append(group)
        group.reset()
        return group

    def _restore(self) -> TrainerProgress:
        """Resume from the newest valid checkpoint, or start from ``checkpoint.path`` weights, or fresh."""
        if self.spec.checkpoint.resume:
            checkpoint = self.store.latest()
            if checkpoint is not None:
                progress = self.store.load(checkpoint, self.train_policy)
                logger.info("resumed from %s (epoch %d)", checkpoint.path, progress.epoch)
                return progress
        if self.spec.checkpoint.path:
            self.train_policy.load_checkpoint(str(_checkpoint_file(self.spec.checkpoint.path)))
            logger.info("initial weights from %s", self.spec.checkpoint.path)
        return TrainerProgress()

    def _publish(self, version: int) -> None:
        """Strategy None: the eval policy loads the trainer's weights synchronously."""
        self.eval_policy.load_state_dict(self.train_policy.get_trainable_parameters())
        self.eval_policy.weight_version = version

    def _already_complete(self, done: dict[str, object]) -> RunSummary:
        fields = {name: done[name] for name in RunSummary.__dataclass_fields__ if name in done}
        summary = RunSummary(**{**fields, "already_complete": True})  # type: ignore[arg-type]
        notify(self.observers, "on_finish", summary)
        return summary

    # ------------------------------------------------------------------ evaluation only
    def _evaluate_checkpoint(self) -> RunSummary:
        train = self.spec.train
        started = self.clock()
        group = self._group(base_seed=train.seed + EVAL_SEED_OFFSET)
        self.eval_policy.init_eval(None, env_meta=group.meta)
        assert self.spec.checkpoint.path is not None  # the spec's cross-field rule
        self.eval_policy.load_checkpoint(str(_checkpoint_file(self.spec.checkpoint.path)))
        result = RolloutWorker(group, self.eval_policy).evaluate(train.eval_episodes, seed=train.seed)
        summary = RunSummary(
            job=self.job.name,
            final_return=result.mean_return,
            env_steps=sum(result.lengths),
            epochs=0,
            wall_seconds=self.clock() - started,
            weight_version=0,
            stop_reason="evaluated",
            fingerprints_consistent=True,
            eval_return=result.mean_return,
            episodes=len(result.returns),
            paths=self.paths.as_dict(),
        )
        notify(self.observers, "on_finish", summary)
        return summary


def _numbers(value: object) -> dict[str, float]:
    """The numeric entries of whatever ``train()`` returned (RLightning policies return a dict or None)."""
    if not isinstance(value, dict):
        return {}
    out: dict[str, float] = {}
    for key, item in value.items():
        try:
            out[str(key)] = float(item)
        except (TypeError, ValueError):
            continue
    return out
