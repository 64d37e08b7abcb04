"""The eval engine (RLightning's EvaluationEngine, over pods): no training, score a saved policy.

I/O (runs on train rank 0). The policy at ``spec.checkpoint.path`` is published as version 1;
eval workers load it and play ``train.evalEpisodes`` greedy episodes between them; the summary
reports their mean return.
"""

from __future__ import annotations

import logging

from rlkube.contract import CoordinatorPhase
from rlkube.coordinator.state import EngineStatus
from rlkube.engine.checkpoint import TrainerProgress
from rlkube.engine.report import RunSummary
from rlkube.engine.trainer import RankZeroEngine, policy_file

logger = logging.getLogger(__name__)


class EvalEngine(RankZeroEngine):
    #: Evaluations wait this long for eval workers (they may still be starting).
    EVALUATION_TIMEOUT = 900.0

    def run(self) -> RunSummary:
        path = self.spec.checkpoint.path
        assert path is not None  # the spec's cross-field rule
        target = policy_file(path)
        self.ctx.policy.load_checkpoint(str(target))
        self.ctx.channel.share_state(self.ctx.policy, None)
        tracker = self.tracker(TrainerProgress())
        self.publish(1)
        self.coordinator.update(EngineStatus(phase=CoordinatorPhase.RUNNING, message=f"evaluating {target}"))
        returns = self.coordinator.evaluate(
            epoch=0, version=1, episodes=self.spec.train.eval_episodes, timeout=self.EVALUATION_TIMEOUT
        )
        if not returns:
            raise RuntimeError(f"no eval worker evaluated {target} within {self.EVALUATION_TIMEOUT:.0f} s")
        mean = sum(returns) / len(returns)
        tracker.record_evaluation(mean)
        self.check_fingerprints(1)
        return self.finish(
            tracker,
            stop_reason="evaluated",
            details={"evaluated": str(target), "final_return": mean},
            episodes=len(returns),
        )
