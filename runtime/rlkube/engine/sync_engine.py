"""The sync engine (RLightning's SyncRLEngine, over pods): collect with v, train, publish v+1.

I/O (runs on train rank 0). Each epoch the coordinator queues the epoch's fragments; every live
eval worker leases them (a new worker joins the next lease, a vanished one's leases go to the
others), having first loaded version v. When all are in, every rank trains on its shard, the
weights are published as v+1, and the eval workers swap them in in the background while the
next epoch's work is queued. The fingerprints the workers report for v+1 are checked against
the trainer's before the epoch after is trained.
"""

from __future__ import annotations

import logging

from rlkube.contract import CoordinatorPhase
from rlkube.coordinator.state import EngineStatus
from rlkube.engine.report import RunSummary
from rlkube.engine.trainer import RankZeroEngine, Stopped
from rlkube.spec import WeightStrategy

logger = logging.getLogger(__name__)


class SyncEngine(RankZeroEngine):
    def run(self) -> RunSummary:
        train = self.spec.train
        progress = self.restore()
        tracker = self.tracker(progress)
        version = progress.weight_version
        self.publish(version)  # workers start from the restored (or initial) weights
        stop_reason = "target_return" if tracker.target_reached else "max_epochs"
        try:
            while stop_reason == "max_epochs" and tracker.epoch < train.max_epochs:
                epoch = tracker.epoch
                self.coordinator.open_epoch(epoch=epoch, version=version)
                self.coordinator.update(EngineStatus(phase=CoordinatorPhase.RUNNING, epoch=epoch))
                batch = self.wait_batch(f"epoch {epoch + 1}")
                consistent = self.check_fingerprints(version)
                shard = self.offer(batch)
                self.fragments_trained += len(batch.fragments)
                version += 1
                metrics = self.train_on(shard, version=version)
                due = train.eval_interval and (epoch + 1) % train.eval_interval == 0
                eval_return = self.evaluate(epoch=epoch + 1, version=version) if due else None
                if self.record_epoch(
                    tracker,
                    batch,
                    version=version,
                    metrics=metrics,
                    consistent=consistent,
                    eval_return=eval_return,
                ):
                    stop_reason = "target_return"
        except Stopped:
            logger.info("stopping at epoch %d (SIGTERM); saving a checkpoint", tracker.epoch)
            self.save(tracker)
            raise
        if train.eval_interval and (not tracker.evaluations or tracker.evaluations[-1][0] != tracker.epoch):
            result = self.evaluate(epoch=tracker.epoch, version=version)
            if result is not None:
                tracker.record_evaluation(result)
        # The last version's check: give the workers a moment to load and report it (an evaluation
        # of it has made its worker load it). With strategy None nothing loads in the background.
        if self.spec.policy.weight_buffer.strategy is not WeightStrategy.NONE:
            self.coordinator.loads.wait_for_eval_weight_update(timeout=15.0)
        self.check_fingerprints(version)
        live = self.coordinator.progress
        details = {
            "weight_wait_fraction": round(live.weight_wait_fraction(), 4),
            "duplicate_pushes": live.duplicates,
            "fragments_acknowledged": live.fragments,
            "fragments_trained": self.fragments_trained,
        }
        return self.finish(tracker, stop_reason=stop_reason, details=details)
