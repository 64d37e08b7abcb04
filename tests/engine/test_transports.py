"""One behaviour suite, two transports: ``rlkube run --in-process`` and ``rlkube run`` (a local cluster).

The same job with the same seed must be the same run either way: the same fragments per epoch,
evaluations at the same epochs, checkpoints with the same files, keys and shapes, and (the
policy acts greedily, envs are seeded and each epoch is one minibatch, so the run is
deterministic up to the order of a sum) the same numbers in them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from rlkube.cli import main
from rlkube.engine.checkpoint import META_FILE, POLICY_FILE, TRAINER_FILE, CheckpointStore

from tests.engine.jobs import tiny_document

ROOT = Path(__file__).resolve().parents[2]
TRANSPORTS = ("in-process", "local-cluster")
EPOCHS, STEPS, FRAGMENT, ENVS = 3, 32, 8, 2
FRAGMENTS_PER_EPOCH = STEPS // (FRAGMENT * ENVS)
EVAL_EPISODES = 2


def job_document(**spec: Any) -> dict[str, Any]:
    document = tiny_document(
        maxEpochs=EPOCHS,
        stepsPerEpoch=STEPS,
        fragmentLength=FRAGMENT,
        batchSize=STEPS,  # one minibatch: shuffling only reorders a sum
        evalInterval=2,
        evalEpisodes=EVAL_EPISODES,
        saveInterval=1,
    )
    document["spec"].update(
        {
            "imports": ["tests.engine.greedy_policy"],
            "policy": {"type": "GreedyPPO", "algoCfg": {"updateEpochs": 2}, "optimCfg": {"lr": 0.001}},
            "env": {"id": "CartPole-v1", "numEnvs": ENVS},
            "checkpoint": {"keep": EPOCHS},
            **spec,
        }
    )
    return document


def run_job(transport: str, document: dict[str, Any], directory: Path) -> Path:
    """``rlkube run`` the job on ``transport``; the run directory (the run must succeed)."""
    job = directory / "job.yaml"
    job.write_text(yaml.safe_dump(document))
    run_dir = directory / "run"
    args = ["run", str(job), "--run-dir", str(run_dir), "--no-progress"]
    assert main([*args, "--in-process"] if transport == "in-process" else args) == 0
    return run_dir


@pytest.fixture(scope="module")
def run_once(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, str], Path]:
    """Each (transport, job) runs once per module, whichever tests ask for it."""
    runs: dict[tuple[str, str], Path] = {}
    documents: dict[str, Callable[[], dict[str, Any]]] = {
        "train": job_document,
        # Scores the in-process run's last checkpoint, so both transports evaluate the same weights.
        "evaluate": lambda: job_document(
            engine="eval",
            checkpoint={"path": str(trained_checkpoint(run("in-process", "train")))},
        ),
    }

    def run(transport: str, job: str) -> Path:
        if (transport, job) not in runs:
            directory = tmp_path_factory.mktemp(f"{transport}-{job}")
            runs[transport, job] = run_job(transport, documents[job](), directory)
        return runs[transport, job]

    mp = pytest.MonkeyPatch()  # the cluster's pods import tests.engine.greedy_policy from the checkout
    mp.setenv("PYTHONPATH", os.pathsep.join([str(ROOT / "runtime"), str(ROOT / "operator"), str(ROOT)]))
    mp.chdir(ROOT)
    yield run
    mp.undo()


def trained_checkpoint(run_dir: Path) -> Path:
    return run_dir / "checkpoints" / f"ckpt-{EPOCHS:06d}"


def summary_of(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "summary.json").read_text())


@pytest.fixture(params=TRANSPORTS)
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_every_epoch_trains_on_the_fragments_the_job_asks_for(run_once, transport: str) -> None:
    summary = summary_of(run_once(transport, "train"))
    assert summary["stop_reason"] == "max_epochs"
    assert summary["epochs"] == EPOCHS
    assert summary["env_steps"] == EPOCHS * STEPS
    assert summary["weight_version"] == EPOCHS
    assert summary["fragments_trained"] == EPOCHS * FRAGMENTS_PER_EPOCH
    assert summary["fragments_acknowledged"] == summary["fragments_trained"]
    assert summary["fingerprints_consistent"] is True
    assert summary["fingerprint_checks"] == EPOCHS + 1  # v0 to v3: the last one was loaded to evaluate it


def test_evaluations_run_every_eval_interval_and_after_the_last_epoch(run_once, transport: str) -> None:
    latest = CheckpointStore(run_once(transport, "train") / "checkpoints").latest()
    assert latest is not None
    assert [epoch for epoch, _, _ in latest.progress.evaluations] == [2, 3]


def test_a_checkpoint_is_written_every_save_interval_and_named_in_the_summary(
    run_once, transport: str
) -> None:
    run_dir = run_once(transport, "train")
    names = sorted(p.name for p in (run_dir / "checkpoints").glob("ckpt-*"))
    assert names == [f"ckpt-{epoch:06d}" for epoch in range(1, EPOCHS + 1)]
    assert summary_of(run_dir)["paths"]["checkpoint"] == str(trained_checkpoint(run_dir))
    for name in names:
        assert {p.name for p in (run_dir / "checkpoints" / name).iterdir()} == {
            POLICY_FILE,
            TRAINER_FILE,
            META_FILE,
        }


def test_the_eval_engine_plays_the_job_s_evaluation_episodes(run_once, transport: str) -> None:
    summary = summary_of(run_once(transport, "evaluate"))
    assert summary["stop_reason"] == "evaluated"
    assert summary["epochs"] == 0
    assert summary["episodes"] == EVAL_EPISODES
    assert summary["eval_return"] > 0


# ---------------------------------------------------------------------------- across transports
def structure(value: Any) -> Any:
    """Keys, tensor shapes and dtypes of a nested checkpoint state; other leaves by type."""
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), str(value.dtype))
    if isinstance(value, dict):
        return {key: structure(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [structure(item) for item in value]
    return type(value).__name__


def assert_close(a: Any, b: Any, *, where: str) -> None:
    if isinstance(a, torch.Tensor):
        assert torch.allclose(a.double(), b.double(), rtol=1e-4, atol=1e-6), where
    elif isinstance(a, dict):
        for key in a:
            assert_close(a[key], b[key], where=f"{where}.{key}")
    elif isinstance(a, list | tuple):
        for index, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_close(x, y, where=f"{where}[{index}]")
    else:
        assert a == b, where


def load(path: Path) -> Any:
    return torch.load(path, map_location="cpu", weights_only=True)


def test_both_transports_write_the_same_checkpoints(run_once) -> None:
    in_process, cluster = (run_once(t, "train") for t in TRANSPORTS)
    for epoch in range(1, EPOCHS + 1):
        a, b = (r / "checkpoints" / f"ckpt-{epoch:06d}" for r in (in_process, cluster))
        for name in (POLICY_FILE, TRAINER_FILE):
            assert structure(load(a / name)) == structure(load(b / name)), f"{a.name}/{name}"
        assert_close(load(a / POLICY_FILE), load(b / POLICY_FILE), where=f"{a.name} weights")
        assert_close(
            load(a / TRAINER_FILE)["optimizers"], load(b / TRAINER_FILE)["optimizers"], where=f"{a.name} Adam"
        )
        progress_a, progress_b = (json.loads((d / META_FILE).read_text())["progress"] for d in (a, b))
        for key in ("epoch", "env_steps", "weight_version", "episodes", "evaluations"):
            assert progress_a[key] == progress_b[key], f"{a.name} progress.{key}"


def test_both_transports_score_a_checkpoint_alike(run_once) -> None:
    in_process, cluster = (summary_of(run_once(t, "evaluate")) for t in TRANSPORTS)
    assert in_process["eval_return"] == cluster["eval_return"]
    assert in_process["episodes"] == cluster["episodes"] == EVAL_EPISODES
