"""RLJob manifests the operator tests and the real-API-server tests share: plain data, no cluster."""

from __future__ import annotations

import copy
from typing import Any


def job_document(name: str, **spec: Any) -> dict[str, Any]:
    document: dict[str, Any] = {
        "apiVersion": "rlkube.io/v1alpha1",
        "kind": "RLJob",
        "metadata": {"name": name},
        "spec": {"env": {"id": "CartPole-v1"}, "trainer": {"replicas": 1}, "evaluator": {"replicas": 1}},
    }
    for key, value in spec.items():
        document["spec"][key] = value
    return document


# (what is set, value, field path the error must name)
MALFORMED: list[tuple[str, Any, str]] = [
    ("spec.train.maxEpochs", -3, "spec.train.maxEpochs"),
    ("spec.train.maxEpochs", "many", "spec.train.maxEpochs"),
    ("spec.train.stepsPerEpoch", 0, "spec.train.stepsPerEpoch"),
    ("spec.engine", "turbo", "spec.engine"),
    ("spec.policy.rolloutMode", "parallel", "spec.policy.rolloutMode"),
    ("spec.policy.weightBuffer.strategy", "Triple", "spec.policy.weightBuffer.strategy"),
    ("spec.policy.weightBuffer.chunkBytes", 10, "spec.policy.weightBuffer.chunkBytes"),
    ("spec.policy.weightBuffer.streams", 65, "spec.policy.weightBuffer.streams"),
    ("spec.env.numEnvs", 0, "spec.env.numEnvs"),
    ("spec.env.id", "", "spec.env.id"),
    ("spec.env.vectorization", "threads", "spec.env.vectorization"),
    ("spec.trainer.replicas", 0, "spec.trainer.replicas"),
    ("spec.trainer.backend", "mpi", "spec.trainer.backend"),
    ("spec.evaluator.replicas", -1, "spec.evaluator.replicas"),
    ("spec.runPolicy.cleanPodPolicy", "Some", "spec.runPolicy.cleanPodPolicy"),
    ("spec.runPolicy.backoffLimit", -1, "spec.runPolicy.backoffLimit"),
    ("spec.runPolicy.activeDeadlineSeconds", 0, "spec.runPolicy.activeDeadlineSeconds"),
    ("spec.log.level", "loud", "spec.log.level"),
    ("spec.log.intervalSeconds", 0, "spec.log.intervalSeconds"),
    ("spec.buffer.type", "ring", "spec.buffer.type"),
    ("spec.train.fragmentLength", 0, "spec.train.fragmentLength"),
    ("spec.policy.modelCfg", [1, 2], "spec.policy.modelCfg"),
    ("spec.trainer.resources.limits", {"cpu": "lots"}, "spec.trainer.resources.limits"),
    ("spec.trainer.env", [{"value": "1"}], "spec.trainer.env[0].name"),
    ("spec.train.batchSize", 4096, "spec.train.batchSize"),  # CEL: more than stepsPerEpoch
    ("spec.trainer.backend", "nccl", "spec.trainer.backend"),  # CEL: nccl without GPUs
    ("spec.engine", "eval", "spec.checkpoint.path"),  # CEL: eval needs a checkpoint
    ("spec.evaluator.env", [{"name": "RANK", "value": "1"}], "spec.evaluator.env"),  # CEL: reserved
    ("spec.trainer.env", [{"name": "PET_NNODES", "value": "1"}], "spec.trainer.env"),  # CEL: reserved
    ("metadata.name", "x" * 41, "metadata.name"),
]


def malformed(index: int, path: str, value: Any) -> dict[str, Any]:
    document = job_document(f"bad{index}")
    node = document
    *parents, last = path.split(".")
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = copy.deepcopy(value)
    return document
