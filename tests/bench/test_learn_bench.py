"""``rlkube bench learn``: SB3 gets the job's hyperparameters; the curve maths; a tiny run end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rlkube.jobfile import load_job

from benchmarks.learn.curve import smoothed, steps_to_target

ROOT = Path(__file__).resolve().parents[2]


def test_steps_to_target_is_the_first_episode_end_where_the_window_mean_reaches_it() -> None:
    episodes = [(100, 10.0), (200, 20.0), (300, 30.0), (400, 40.0)]
    assert steps_to_target(episodes, 25.0, window=2) == 300  # mean(20, 30) = 25
    assert steps_to_target(episodes, 41.0, window=2) is None
    assert steps_to_target(episodes[:1], 5.0, window=2) is None  # a full window is needed
    assert smoothed(episodes, window=2) == [(100, 10.0), (200, 15.0), (300, 25.0), (400, 35.0)]


def test_the_sb3_peer_gets_the_same_hyperparameters_in_its_own_conventions() -> None:
    pytest.importorskip("stable_baselines3")
    from benchmarks.learn.sb3_peer import sb3_kwargs

    job = load_job(ROOT / "examples" / "cartpole.yaml", ["spec.policy.algoCfg.clipVloss=true"])
    kwargs = sb3_kwargs(job)
    spec = job.spec
    assert kwargs["n_steps"] * spec.env.num_envs == spec.train.steps_per_epoch  # one update per epoch
    assert kwargs["batch_size"] == spec.train.batch_size
    assert kwargs["n_epochs"] == spec.policy.algo_cfg["updateEpochs"]
    assert kwargs["vf_coef"] == spec.policy.algo_cfg["vfCoef"] / 2  # SB3: mse; rlkube: 0.5 * mse
    assert kwargs["clip_range_vf"] == kwargs["clip_range"]
    assert kwargs["learning_rate"](0.5) == pytest.approx(0.5 * spec.policy.optim_cfg["lr"])
    assert kwargs["policy_kwargs"]["net_arch"] == {"pi": [64, 64], "vf": [64, 64]}
    atari = sb3_kwargs(load_job(ROOT / "examples" / "breakout.yaml"))
    assert atari["policy"] == "CnnPolicy"
    assert "net_arch" not in atari["policy_kwargs"]


def test_a_tiny_learn_bench_prints_the_curve_and_writes_png_and_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("stable_baselines3")
    from benchmarks.learn.run import main

    png, out = tmp_path / "curves.png", tmp_path / "curves.json"
    argv = [
        "examples/cartpole.yaml",
        "--seeds",
        "1",
        "--steps",
        "1024",
        "--png",
        str(png),
        "--json",
        str(out),
    ]
    assert main([str(ROOT / argv[0]), *argv[1:]]) == 0
    printed = capsys.readouterr().out
    assert "learning curve" in printed
    assert "rlkube" in printed
    assert "sb3" in printed
    assert png.stat().st_size > 0
    runs = json.loads(out.read_text())["runs"]
    assert {r["side"] for r in runs} == {"rlkube", "sb3"}
    assert all(r["env_steps"] >= 1024 for r in runs)
