"""Tiny jobs for engine tests: a few hundred CartPole steps, done in a second or two."""

from __future__ import annotations

import copy
from typing import Any

from rlkube.spec import RLJob, parse_job

TINY: dict[str, Any] = {
    "apiVersion": "rlkube.io/v1alpha1",
    "kind": "RLJob",
    "metadata": {"name": "tiny"},
    "spec": {
        "policy": {"type": "PPO", "algoCfg": {"updateEpochs": 2}, "optimCfg": {"lr": 0.001}},
        "env": {"id": "CartPole-v1", "numEnvs": 2},
        "train": {
            "maxEpochs": 2,
            "stepsPerEpoch": 32,
            "fragmentLength": 8,
            "batchSize": 16,
            "evalInterval": 0,
            "saveInterval": 1,
            "seed": 3,
        },
    },
}


def tiny_document(**train: Any) -> dict[str, Any]:
    document = copy.deepcopy(TINY)
    document["spec"]["train"].update(train)
    return document


def tiny_job(*, spec: dict[str, Any] | None = None, **train: Any) -> RLJob:
    document = tiny_document(**train)
    for key, value in (spec or {}).items():
        document["spec"][key] = value
    return parse_job(document)
