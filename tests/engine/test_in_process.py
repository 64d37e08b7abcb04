"""The in-process run trains, moves weights, evaluates, reports and stops as the job says."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any

import pytest
from rlkube.engine.report import LearningCurve, SummaryFiles, TensorBoardLog
from rlkube.engine.run_paths import RunPaths
from rlkube.envs.types import EnvRet, PolicyResponse
from rlkube.launch.in_process import InProcessRun
from rlkube.policy import POLICIES
from rlkube.policy.builtin.ppo import PPO
from rlkube.spec import SpecError

from tests.engine.jobs import tiny_job


@POLICIES.register("AsyncPPO")
class AsyncPPO(PPO):
    """PPO whose rollout_step is a coroutine (rolloutMode: async)."""

    async def rollout_step(  # type: ignore[override]
        self, env_ret: EnvRet, deterministic: bool = False, **kwargs: Any
    ) -> PolicyResponse:
        return PPO.rollout_step(self, env_ret, deterministic=deterministic)


def run(job: Any, run_dir: Path, policy: type = PPO) -> Any:
    paths = RunPaths(run_dir).create()
    engine = InProcessRun(
        job,
        policy,
        paths=paths,
        observers=[TensorBoardLog(paths.tensorboard), LearningCurve(paths.plot), SummaryFiles(paths.summary)],
    )
    return engine, engine.run()


def test_a_short_run_leaves_summary_logs_plot_and_checkpoint(tmp_path: Path) -> None:
    engine, summary = run(tiny_job(maxEpochs=3, saveInterval=2, evalInterval=2, evalEpisodes=2), tmp_path)
    assert summary.epochs == 3
    assert summary.env_steps == 3 * 32
    assert summary.weight_version == 3
    assert summary.stop_reason == "max_epochs"
    assert summary.fingerprints_consistent is True
    assert summary.eval_return is not None
    assert engine.eval_policy.weight_version == 3
    assert engine.eval_policy.get_param_fingerprint() == engine.train_policy.get_param_fingerprint()
    data = json.loads((tmp_path / "summary.json").read_text())
    for key in (
        "final_return",
        "env_steps",
        "epochs",
        "wall_seconds",
        "weight_version",
        "fingerprints_consistent",
    ):
        assert key in data
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert (tmp_path / "learning_curve.png").read_bytes()[:4] == b"\x89PNG"
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("ckpt-*")) == ["ckpt-000002", "ckpt-000003"]
    assert Path(data["paths"]["checkpoint"]).name == "ckpt-000003"
    assert (tmp_path / "checkpoints" / "COMPLETE.json").is_file()


def test_tensorboard_gets_the_cleanrl_metrics(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run(tiny_job(maxEpochs=2), tmp_path)
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"losses/policy_loss", "losses/approx_kl", "charts/learning_rate", "charts/SPS"} <= tags
    assert [e.step for e in events.Scalars("charts/weight_version")] == [32, 64]


def test_the_target_return_stops_the_run_early(tmp_path: Path) -> None:
    _, summary = run(tiny_job(maxEpochs=50, targetReturn=5.0, saveInterval=0), tmp_path)
    assert summary.stop_reason == "target_return"
    assert summary.epochs < 50
    assert summary.final_return >= 5.0
    assert summary.env_steps_to_target == summary.env_steps
    assert summary.episodes >= 20


def test_async_rollout_mode_trains_through_the_admission_gate(tmp_path: Path) -> None:
    job = tiny_job(spec={"policy": {"type": "AsyncPPO", "rolloutMode": "async"}})
    engine, summary = run(job, tmp_path, AsyncPPO)
    assert summary.epochs == 2
    assert summary.fingerprints_consistent
    assert engine.eval_policy.num_requests == 0


def test_the_eval_engine_scores_a_saved_policy_without_training(tmp_path: Path) -> None:
    run(tiny_job(maxEpochs=1), tmp_path / "train")
    checkpoint = tmp_path / "train" / "checkpoints" / "ckpt-000001"
    job = tiny_job(evalEpisodes=3, spec={"engine": "eval", "checkpoint": {"path": str(checkpoint)}})
    _, summary = run(job, tmp_path / "eval")
    assert summary.stop_reason == "evaluated"
    assert summary.episodes == 3
    assert summary.epochs == 0
    assert not list((tmp_path / "eval" / "checkpoints").glob("ckpt-*"))


def test_bad_policy_settings_are_refused_before_anything_starts(tmp_path: Path) -> None:
    job = tiny_job(spec={"policy": {"type": "PPO", "algoCfg": {"gamma": 2}}})
    with pytest.raises(SpecError, match=r"spec\.policy\.algoCfg\.gamma"):
        InProcessRun(job, PPO, paths=RunPaths(tmp_path / "never"))
    assert not (tmp_path / "never").exists()


def test_the_async_engine_runs_in_process_within_max_staleness(tmp_path: Path) -> None:
    job = tiny_job(maxEpochs=3, maxStaleness=1, spec={"engine": "async", "buffer": {"capacity": 8}})
    _, summary = run(job, tmp_path)
    assert summary.epochs == 3
    assert summary.engine == "async"
    data = json.loads((tmp_path / "summary.json").read_text())
    assert set(data["lag_distribution"]) <= {"0", "1"}
    assert data["fragments_trained"] == sum(data["lag_distribution"].values())


class RecordingPPO(PPO):
    """Records the batch shapes update_dataset receives and skips training."""

    shapes: list[tuple[int, ...]] = []

    def update_dataset(self, data: Any) -> None:
        RecordingPPO.shapes.append(tuple(data.batch_size))
        self.dataset = data

    def train(self, *args: Any, **kwargs: Any) -> Any:
        return {}


def test_on_policy_data_is_the_epoch_s_rows_and_replay_data_is_sampled_transitions(tmp_path: Path) -> None:
    RecordingPPO.shapes = []
    run(tiny_job(maxEpochs=1), tmp_path / "rollout", RecordingPPO)
    assert RecordingPPO.shapes == [(4, 8)]  # 2 fragments x 2 envs, 8 steps
    RecordingPPO.shapes = []
    run(
        tiny_job(maxEpochs=2, spec={"buffer": {"type": "replay", "capacity": 1000}}),
        tmp_path / "replay",
        RecordingPPO,
    )
    assert RecordingPPO.shapes == [(32,), (32,)]


def test_torch_runs_single_threaded_unless_omp_num_threads_says_otherwise() -> None:
    from rlkube.launch.in_process import torch_threads

    assert torch_threads({}) == 1
    assert torch_threads({"OMP_NUM_THREADS": "4"}) == 4
    assert torch_threads({"OMP_NUM_THREADS": "lots"}) == 1


class BrokenRolloutPPO(PPO):
    """PPO whose rollout fails, as a policy under development might."""

    def rollout_step(self, env_ret: EnvRet, deterministic: bool = False, **kwargs: Any) -> PolicyResponse:
        raise ValueError("rollout_step is broken")


def test_a_failing_eval_worker_ends_the_run_with_its_own_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="rollout_step is broken"):
        run(tiny_job(maxEpochs=2), tmp_path, BrokenRolloutPPO)
    assert not (tmp_path / "checkpoints" / "COMPLETE.json").exists()


def test_eval_workers_are_told_to_stop_before_the_observers_finish(tmp_path: Path) -> None:
    # Plots and summaries are drawn after the job is over: eval workers must not wait for them
    # (on a cluster the launcher and the operator stop them once the job is complete).
    told_to_stop = threading.Event()

    class Watch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "the job is finished" in record.getMessage():
                told_to_stop.set()

    class SlowObserver:
        stopped_first: bool | None = None

        def on_start(self, start: object) -> None: ...

        def on_epoch(self, record: object) -> None: ...

        def on_finish(self, summary: object) -> None:
            SlowObserver.stopped_first = told_to_stop.wait(30.0)

    watcher = Watch(logging.INFO)
    worker_log = logging.getLogger("rlkube.engine.worker")
    previous_level = worker_log.level
    worker_log.addHandler(watcher)
    worker_log.setLevel(logging.INFO)
    try:
        InProcessRun(
            tiny_job(maxEpochs=1), PPO, paths=RunPaths(tmp_path).create(), observers=[SlowObserver()]
        ).run()
    finally:
        worker_log.removeHandler(watcher)
        worker_log.setLevel(previous_level)
    assert SlowObserver.stopped_first is True
