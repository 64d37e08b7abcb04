"""The one job both control planes run in the backoff tests: 4 train ranks, rank 1 always crashes."""

from __future__ import annotations

from typing import Any

BACKOFF_LIMIT = 1
#: A crash of the group counts once; the job fails at the crash after ``backoffLimit`` restarts.
CRASHES_TO_FAIL = BACKOFF_LIMIT + 1


def crashing_job(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "rlkube.io/v1alpha1",
        "kind": "RLJob",
        "metadata": {"name": name},
        "spec": {
            "imports": ["tests.run_policy.crashing_policy"],
            "policy": {
                "type": "RankOneCrashingPPO",
                "modelCfg": {"hiddenSizes": [16]},
                "algoCfg": {"updateEpochs": 1},
            },
            "env": {"id": "CartPole-v1", "numEnvs": 2},
            "train": {
                "maxEpochs": 5,
                "stepsPerEpoch": 64,
                "fragmentLength": 16,
                "batchSize": 32,
                "evalInterval": 0,
                "saveInterval": 1,
            },
            "trainer": {"replicas": 4, "backend": "gloo"},
            "evaluator": {"replicas": 1},
            "runPolicy": {"backoffLimit": BACKOFF_LIMIT},
            "log": {"intervalSeconds": 0.5},
        },
    }
