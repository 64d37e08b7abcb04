"""Every strategy delivers the trainer's weights to eval policies: fingerprints and bytes match."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch
from rlkube.weights.consistency import verify_eval_weight_consistency
from rlkube.weights.errors import WriterBusyError
from rlkube.weights.plane import EvalPlaneConfig, EvalWeightPlane
from rlkube.weights.publisher import PublisherConfig, WeightPublisher

from tests.weights.tiny import observation, tiny_policy

HIDDEN = 192  # ~13 KB of weights: several 1 KiB chunks per range
CHUNK = 1 << 10


def assert_same_weights(trainer, evaluator) -> None:
    train_sd = trainer.get_trainable_parameters()
    eval_sd = evaluator.get_trainable_parameters()
    for module, params in train_sd.items():
        for name, tensor in params.items():
            assert torch.equal(eval_sd[module][name], tensor), f"{module}.{name} differs"


@pytest.mark.parametrize("strategy", ["None", "Double", "Shared", "Sharded"])
def test_train_and_eval_fingerprints_match_after_a_sync(strategy: str, shm_dir: Path) -> None:
    trainer = tiny_policy("train", hidden=HIDDEN)
    trainer.init_train()
    rank0 = WeightPublisher(
        PublisherConfig(
            shm_dir=shm_dir / "rank0", listen="127.0.0.1:0", incarnation="job-a", chunk_bytes=CHUNK
        )
    ).connect()
    rank1 = WeightPublisher(
        PublisherConfig(
            shm_dir=shm_dir / "rank1", listen="127.0.0.1:0", incarnation="job-a", chunk_bytes=CHUNK
        )
    ).connect()
    rank0.config = PublisherConfig(**{**rank0.config.__dict__, "peers": (rank1.address,)})
    evaluators, planes = [], []
    try:
        for i in range(2):
            policy = tiny_policy("eval", strategy=strategy, hidden=HIDDEN, seed=100 + i)
            plane = EvalWeightPlane(
                EvalPlaneConfig(strategy, shm_dir / "node", rank0.address, f"eval-{i}", streams=3)
            )
            plane.attach(policy)
            policy.init_eval()
            plane.start(policy)
            evaluators.append(policy)
            planes.append(plane)
        for _ in range(3):
            trainer.train()
            state = trainer.get_trainable_parameters()
            rank1.send(state)
            version = rank0.send(state, fingerprint=trainer.get_param_fingerprint())
            for policy, plane in zip(evaluators, planes, strict=True):
                assert plane.sync(policy, min_version=version, timeout=30) == ("job-a", version)
                assert_same_weights(trainer, policy)
                policy._rollout(observation())  # the swapped-in weights are usable
            report = verify_eval_weight_consistency(
                trainer.get_param_fingerprint(),
                {
                    p.config.worker_id: p.loaded_report(e).fingerprint
                    for p, e in zip(planes, evaluators, strict=True)
                },
            )
            assert report.consistent, report.summary()
        total = rank0.latest().total_bytes
        served = rank0.board.stats.bytes + rank1.board.stats.bytes
        readers_per_fetch = {"None": 1, "Double": 1, "Shared": 2, "Sharded": 2}[strategy]
        assert served == 3 * total * len(evaluators) // readers_per_fetch
        if strategy == "Sharded":
            assert rank1.board.stats.bytes > 0  # ranges really came from the peer rank
        else:
            assert rank1.board.stats.bytes == 0
    finally:
        for policy in evaluators:
            policy.close()
        for plane in planes:
            plane.close()
        rank0.close()
        rank1.close()


def test_eval_policies_on_the_trainers_node_read_its_buffer_without_any_fetch(shm_dir: Path) -> None:
    trainer = tiny_policy("train")
    trainer.init_train()
    with WeightPublisher(PublisherConfig(shm_dir=shm_dir, listen="127.0.0.1:0")) as publisher:
        policy = tiny_policy("eval", strategy="Shared", seed=5)
        plane = EvalWeightPlane(EvalPlaneConfig("Shared", shm_dir, publisher.address, "eval-0"))
        plane.attach(policy)
        policy.init_eval()
        plane.start(policy)
        try:
            for _ in range(3):
                trainer.train()
                version = publisher.send(trainer.get_trainable_parameters())
                assert plane.sync(policy, min_version=version, timeout=30)[1] == version
                assert_same_weights(trainer, policy)
            assert publisher.board.stats.fetches == 0
            assert not plane.receiver.elected  # the trainer is this directory's writer
        finally:
            policy.close()
            plane.close()


def test_a_restarted_trainer_takes_its_node_directory_back_and_readers_follow_the_new_incarnation(
    shm_dir: Path,
) -> None:
    trainer = tiny_policy("train")
    trainer.init_train()
    first = WeightPublisher(
        PublisherConfig(shm_dir=shm_dir, listen="127.0.0.1:0", incarnation="run-1")
    ).connect()
    policy = tiny_policy("eval", strategy="Shared", seed=3)
    plane = EvalWeightPlane(EvalPlaneConfig("Shared", shm_dir, first.address, "eval-0"))
    plane.attach(policy)
    policy.init_eval()
    plane.start(policy)
    second = None
    try:
        for _ in range(3):
            first.send(trainer.get_trainable_parameters())
        assert plane.sync(policy, min_version=3, timeout=30) == ("run-1", 3)
        first.close()  # train rank 0 dies: the eval process becomes the directory's receiver
        deadline = time.monotonic() + 10
        while not plane.receiver.elected and time.monotonic() < deadline:
            time.sleep(0.05)
        assert plane.receiver.elected
        trainer.train()
        second = WeightPublisher(
            PublisherConfig(shm_dir=shm_dir, listen="127.0.0.1:0", incarnation="run-2", takeover_timeout=10)
        ).connect()
        assert not plane.receiver.elected
        version = second.send(trainer.get_trainable_parameters())
        assert version == 1  # counts from 1 again: lower than what the readers hold
        assert plane.sync(policy, min_version=1, incarnation="run-2", timeout=30) == ("run-2", 1)
        assert_same_weights(trainer, policy)
    finally:
        policy.close()
        plane.close()
        if second is not None:
            second.close()


def test_a_second_trainer_on_the_same_directory_is_refused(shm_dir: Path) -> None:
    with (
        WeightPublisher(PublisherConfig(shm_dir=shm_dir)),
        pytest.raises(WriterBusyError, match="another trainer publishes into"),
    ):
        WeightPublisher(PublisherConfig(shm_dir=shm_dir)).connect()


@pytest.mark.parametrize("strategy", ["None", "Shared"])
def test_a_stopping_worker_stops_waiting_for_a_version_that_will_not_come(
    strategy: str, shm_dir: Path
) -> None:
    trainer = tiny_policy("train")
    trainer.init_train()
    with WeightPublisher(PublisherConfig(shm_dir=shm_dir, listen="127.0.0.1:0")) as publisher:
        version = publisher.send(trainer.get_trainable_parameters())
        policy = tiny_policy("eval", strategy=strategy, seed=5)
        plane = EvalWeightPlane(EvalPlaneConfig(strategy, shm_dir, publisher.address, "eval-0"))
        plane.attach(policy)
        policy.init_eval()
        plane.start(policy)
        stop = threading.Event()
        threading.Timer(0.5, stop.set).start()  # SIGTERM arrives while the worker waits
        try:
            started = time.monotonic()
            held = plane.sync(policy, min_version=version + 1, timeout=60, stop=stop)
            assert time.monotonic() - started < 10, "sync ignored the stop and waited for its timeout"
            assert held is not None
            assert held[1] == version  # what it had; the caller sees it is short of the version it wanted
        finally:
            policy.close()
            plane.close()
