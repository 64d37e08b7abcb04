"""One receiver per node: elected by file lock among eval processes, replaced when it dies."""

from __future__ import annotations

from pathlib import Path

import pytest
from rlkube.weights.consistency import verify_eval_weight_consistency
from rlkube.weights.publisher import PublisherConfig, WeightPublisher

from tests.weights.conftest import Helper
from tests.weights.tiny import tiny_policy


def sync_all(workers: list[Helper], version: int) -> list[dict]:
    for worker in workers:
        worker.send({"sync": version})
    return [worker.read(timeout=60) for worker in workers]


def test_one_fetch_per_node_whatever_the_readers_and_a_new_receiver_takes_over(
    shm_dir: Path, helpers: list[Helper]
) -> None:
    trainer = tiny_policy("train")
    trainer.init_train()
    with WeightPublisher(PublisherConfig(shm_dir=shm_dir / "train", listen="127.0.0.1:0")) as publisher:
        node = shm_dir / "node-a"
        helpers.extend(
            Helper("eval-worker", node, publisher.address, f"eval-{i}", "Shared") for i in range(3)
        )
        for worker in helpers:
            assert worker.read()["ready"]
        for _ in range(3):
            trainer.train()
            version = publisher.send(trainer.get_trainable_parameters())
            answers = sync_all(helpers, version)
            assert [a["version"] for a in answers] == [version] * 3
            assert sum(a["elected"] for a in answers) == 1
            report = verify_eval_weight_consistency(
                trainer.get_param_fingerprint(), {str(a["pid"]): a["fingerprint"] for a in answers}
            )
            assert report.consistent, report.summary()
        total = publisher.latest().total_bytes
        assert publisher.board.stats.fetches == 3
        assert publisher.board.stats.bytes == 3 * total  # one model's worth per version for the node

        elected = next(w for w, a in zip(helpers, answers, strict=True) if a["elected"])
        elected.kill()
        survivors = [w for w in helpers if w is not elected]
        trainer.train()
        version = publisher.send(trainer.get_trainable_parameters())
        answers = sync_all(survivors, version)
        assert [a["version"] for a in answers] == [version] * 2
        assert sum(a["elected"] for a in answers) == 1
        assert publisher.board.stats.fetches == 4
        for worker in survivors:
            worker.send({"exit": True})
            assert worker.read()["closed"]
            assert worker.wait() == 0


@pytest.mark.parametrize("strategy", ["Double", "None"])
def test_per_process_strategies_fetch_once_per_eval_process(
    strategy: str, shm_dir: Path, helpers: list[Helper]
) -> None:
    trainer = tiny_policy("train")
    trainer.init_train()
    with WeightPublisher(PublisherConfig(shm_dir=shm_dir / "train", listen="127.0.0.1:0")) as publisher:
        helpers.extend(
            Helper("eval-worker", shm_dir / "node", publisher.address, f"e{i}", strategy) for i in range(2)
        )
        for worker in helpers:
            assert worker.read()["ready"]
        version = publisher.send(trainer.get_trainable_parameters())
        answers = sync_all(helpers, version)
        assert [a["version"] for a in answers] == [version] * 2
        assert publisher.board.stats.fetches == 2
        for worker in helpers:
            worker.send({"exit": True})
            assert worker.read()["closed"]
