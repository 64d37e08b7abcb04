"""The async engine (RLightning's AsyncRLEngine, over pods): rollouts never wait for training.

I/O (runs on train rank 0). Eval workers collect continuously with whatever version they hold;
the coordinator mints work while fewer than ``buffer.capacity`` fragments are in flight or
waiting (back-pressure). Each step trains on the next ``fragments_per_epoch`` fragments. The
bound ``train.maxStaleness`` holds twice: new work requires a version no older than
``v - maxStaleness``, and a fragment that is nevertheless older when its turn comes (it was
collected while v advanced) is dropped and counted, never trained on. With
``train.staleFragments: vtrace`` nothing is dropped: every fragment is trained on, tagged with its
lag (``policy_lag``), and the policy corrects the stale ones with V-trace (the built-in PPO does,
``rlkube.policy.utils.vtrace``). The lag of every trained fragment is recorded; the summary
reports the distribution and the share of fragments used.

Acknowledged fragments are journalled as with the sync engine (``rlkube.coordinator.journal``):
after a crash of rank 0 the ones the checkpoint does not hold are trained on (or dropped as
stale) by the next incarnation before any new work.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import torch

from rlkube.contract import CoordinatorPhase
from rlkube.coordinator.state import EngineStatus
from rlkube.data.fragment import POLICY_LAG
from rlkube.data.rollout_buffer import EpochBatch
from rlkube.engine.report import RunSummary
from rlkube.engine.trainer import RankZeroEngine, Stopped
from rlkube.spec import StaleFragments

logger = logging.getLogger(__name__)


def split_by_staleness(
    batch: EpochBatch, *, version: int, max_staleness: int
) -> tuple[EpochBatch, list[int], int]:
    """(the fragments within the bound, their lags, how many were dropped). Pure."""
    keep, lags = [], []
    for task_id, fragment in zip(batch.task_ids, batch.fragments, strict=True):
        # Negative only for a fragment taken back from a dead incarnation that had got further
        # (rlkube.coordinator.journal): its version numbers are not ours; it counts as fresh.
        lag = max(0, version - fragment.weight_version)
        if lag <= max_staleness:
            keep.append((task_id, fragment))
            lags.append(lag)
    kept = EpochBatch(
        epoch=batch.epoch,
        task_ids=tuple(t for t, _ in keep),
        fragments=tuple(f for _, f in keep),
    )
    return kept, lags, len(batch.fragments) - len(keep)


def tag_with_lags(batch: EpochBatch, *, version: int) -> tuple[EpochBatch, list[int]]:
    """Every fragment, each with a ``policy_lag`` column (versions behind ``version``); their lags. Pure."""
    tagged, lags = [], []
    for fragment in batch.fragments:
        lag = max(0, version - fragment.weight_version)  # negative: taken back, see split_by_staleness
        data = fragment.data.clone(recurse=False)
        data[POLICY_LAG] = torch.full(tuple(data.batch_size), lag, dtype=torch.int64)
        tagged.append(replace(fragment, data=data))
        lags.append(lag)
    return replace(batch, fragments=tuple(tagged)), lags


def used_share(trained: int, dropped: int) -> float:
    """The share of fragments that reached training (1.0 when none arrived). Pure."""
    return 1.0 if trained + dropped == 0 else trained / (trained + dropped)


class AsyncEngine(RankZeroEngine):
    def run(self) -> RunSummary:
        train = self.spec.train
        bound = train.max_staleness
        correct = train.stale_fragments is StaleFragments.VTRACE
        self.fragments_corrected = 0
        progress = self.restore()
        tracker = self.tracker(progress)
        version = progress.weight_version
        self.publish(version)
        self.coordinator.open_stream(min_version=max(0, version - bound), step=tracker.epoch)
        live = self.coordinator.progress
        stop_reason = "target_return" if tracker.target_reached else "max_epochs"
        try:
            while stop_reason == "max_epochs" and tracker.epoch < train.max_epochs:
                self.coordinator.update(EngineStatus(phase=CoordinatorPhase.RUNNING, epoch=tracker.epoch))
                batch = self.wait_batch(f"step {tracker.epoch + 1}", step=tracker.epoch)
                if correct:
                    kept, lags = tag_with_lags(batch, version=version)
                    dropped = 0
                    self.fragments_corrected += sum(1 for lag in lags if lag > 0)
                else:
                    kept, lags, dropped = split_by_staleness(batch, version=version, max_staleness=bound)
                live.dropped_stale += dropped
                self.fragments_dropped += dropped
                if dropped:
                    logger.info("dropped %d fragments older than v%d - %d", dropped, version, bound)
                if kept.rows < self.ctx.world_size:
                    continue
                live.record_trained(lags)
                consistent = self.check_fingerprints(version)
                shard = self.offer(kept)
                self.fragments_trained += len(kept.fragments)
                version += 1
                metrics = self.train_on(shard, version=version)
                self.coordinator.set_min_version(version - bound)
                due = train.eval_interval and (tracker.epoch + 1) % train.eval_interval == 0
                eval_return = self.evaluate(epoch=tracker.epoch + 1, version=version) if due else None
                if self.record_epoch(
                    tracker,
                    kept,
                    version=version,
                    metrics={
                        **metrics,
                        "charts/max_lag": float(max(lags)),
                        "charts/stale_share": sum(1 for lag in lags if lag > 0) / len(lags),
                    },
                    consistent=consistent,
                    eval_return=eval_return,
                ):
                    stop_reason = "target_return"
        except Stopped:
            logger.info("stopping at step %d (SIGTERM); saving a checkpoint", tracker.epoch)
            self.save(tracker)
            raise
        details = {
            "max_staleness": bound,
            "lag_distribution": {str(k): v for k, v in live.lag_distribution().items()},
            "stale_fragments": train.stale_fragments.value,
            "dropped_stale": live.dropped_stale,
            "corrected_stale": self.fragments_corrected,
            "fragments_used_share": round(used_share(self.fragments_trained, self.fragments_dropped), 4),
            "fragments_acknowledged": live.fragments,
            "fragments_trained": self.fragments_trained,
            "weight_wait_fraction": round(live.weight_wait_fraction(), 4),
            "duplicate_pushes": live.duplicates,
        }
        return self.finish(tracker, stop_reason=stop_reason, details=details)
