"""spec.log.backends: TensorBoard and Weights & Biases (offline) get the same metrics under the same names."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from rlkube.engine.loggers import WandbLog, backend_observers
from rlkube.engine.report import EpochRecord, RunStart, RunSummary, TensorBoardLog, epoch_scalars, notify
from rlkube.spec import LogBackend, LogSpec, WandbSpec

from tests.loggers.wandb_records import history

START = RunStart(job="cartpole", max_epochs=2, start_epoch=0, env_steps=0, weight_version=0)
RECORDS = (
    EpochRecord(
        epoch=1,
        max_epochs=2,
        env_steps=256,
        weight_version=1,
        steps_per_second=900.0,
        recent_return=21.0,
        episodes_total=2,
        new_episodes=((120, 20.0, 20), (250, 22.0, 22)),
        metrics={"losses/value_loss": 0.5, "losses/approx_kl": float("nan")},
    ),
    EpochRecord(
        epoch=2,
        max_epochs=2,
        env_steps=512,
        weight_version=2,
        steps_per_second=1000.0,
        recent_return=30.0,
        episodes_total=3,
        new_episodes=((400, 40.0, 40),),
        metrics={"losses/value_loss": 0.25, "losses/approx_kl": 0.01},
        eval_return=50.0,
        fingerprints_consistent=True,
    ),
)
SUMMARY = RunSummary(
    job="cartpole",
    final_return=30.0,
    env_steps=512,
    epochs=2,
    wall_seconds=1.0,
    weight_version=2,
    stop_reason="max_epochs",
    fingerprints_consistent=True,
)


@pytest.fixture
def offline_wandb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("wandb")
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb-home" / name.lower()))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)


def tensorboard_tags(directory: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(directory))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_tensorboard_and_wandb_log_every_metric_under_the_same_name(tmp_path: Path, offline_wandb) -> None:
    spec = LogSpec.model_validate({"backends": ["tensorboard", "wandb"], "wandb": {"mode": "offline"}})
    observers = backend_observers(
        spec, run_dir=tmp_path, tensorboard_dir=tmp_path / "tensorboard", job="cartpole", config={"seed": 1}
    )
    assert [type(o) for o in observers] == [TensorBoardLog, WandbLog]
    notify(observers, "on_start", START)
    for record in RECORDS:
        notify(observers, "on_epoch", record)
    notify(observers, "on_finish", SUMMARY)

    names = {point.tag for record in RECORDS for point in epoch_scalars(record)}
    assert {"losses/approx_kl", "charts/episodic_return", "eval/mean_return"} <= names
    tensorboard = {
        (tag, step, value)
        for tag, points in tensorboard_tags(tmp_path / "tensorboard").items()
        for step, value in points
    }
    wandb = {
        (key, row["env_steps"], float(value))
        for row in history(tmp_path)
        for key, value in row.items()
        if not key.startswith("_") and key != "env_steps"
    }
    # Every point, under the same name, at the same env step, with the same value (NaN left out by both).
    assert {name for name, _, _ in tensorboard} == {name for name, _, _ in wandb} == names
    # TensorBoard stores float32: compare at its precision.
    assert {(n, s, round(v, 4)) for n, s, v in wandb} == {(n, s, round(v, 4)) for n, s, v in tensorboard}
    assert ("charts/episodic_return", 400, 40.0) in wandb
    assert not any(name == "losses/approx_kl" and step == 256 for name, step, _ in wandb)


def test_a_restarted_rank_zero_resumes_the_same_wandb_run(tmp_path: Path, offline_wandb) -> None:
    first = WandbLog(tmp_path, job="cartpole", spec=WandbSpec(), config={})
    again = WandbLog(tmp_path, job="cartpole", spec=WandbSpec(), config={})
    assert first.run_id() == again.run_id()
    assert (
        first.run_id() != WandbLog(tmp_path / "other", job="cartpole", spec=WandbSpec(), config={}).run_id()
    )


def test_naming_wandb_without_the_package_fails_at_start_up_naming_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)
    spec = LogSpec.model_validate({"backends": ["wandb"]})
    with pytest.raises(ImportError, match=r"rlkube\[wandb\]"):
        backend_observers(spec, run_dir=tmp_path, tensorboard_dir=tmp_path / "tb", job="j", config={})


def test_tensorboard_false_drops_it_and_backends_default_to_tensorboard() -> None:
    assert LogSpec().active_backends() == (LogBackend.TENSORBOARD,)
    spec = LogSpec.model_validate({"tensorboard": False, "backends": ["tensorboard", "wandb", "wandb"]})
    assert spec.active_backends() == (LogBackend.WANDB,)
    with pytest.raises(ValueError, match="swanlab"):
        LogSpec.model_validate({"backends": ["swanlab"]})
