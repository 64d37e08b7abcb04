"""``rlkube bench learn``: SB3 gets the job's hyperparameters; the curve maths; a tiny run end to end."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
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


def test_sides_take_turns_at_going_first_seed_by_seed() -> None:
    from benchmarks.learn.run import interleaved

    sides = ["rlkube", "rlkube-cluster", "sb3"]
    orders = [interleaved(sides, seed) for seed in range(1, 4)]
    assert all(sorted(order) == sorted(sides) for order in orders)
    assert {order[0] for order in orders} == set(sides)  # each side goes first once in three seeds
    assert {order[-1] for order in orders} == set(sides)
    assert interleaved(["rlkube", "sb3"], 2) == ["rlkube", "sb3"]  # two sides: alternate
    assert interleaved(["rlkube", "sb3"], 3) == ["sb3", "rlkube"]


def test_the_report_has_a_row_per_side_and_compares_each_rlkube_side_with_the_peer() -> None:
    from benchmarks.learn.curve import Curve
    from benchmarks.learn.run import report

    job = load_job(ROOT / "examples" / "cartpole.yaml")
    episodes = [(1000 * (i + 1), 500.0) for i in range(20)]

    def curve(side: str, reached: int) -> Curve:
        return Curve(side=side, seed=1, episodes=episodes, env_steps=20_000, wall_seconds=10.0,
                     steps_to_target=reached)  # fmt: skip

    curves = {
        side: [curve(side, at)]
        for side, at in (("rlkube", 30_000), ("rlkube-cluster", 45_000), ("sb3", 30_000))
    }
    text = report(job, 20_000, curves)
    rows = {line.split()[0]: line for line in text.splitlines() if line.strip()}
    assert {"rlkube", "rlkube-cluster", "sb3"} <= set(rows)
    assert "2,000" in rows["rlkube-cluster"]  # env steps/s: 20,000 steps in 10 s
    assert "rlkube / sb3 = 1.00, rlkube-cluster / sb3 = 1.50" in text


def test_an_eval_worker_count_below_one_is_refused_before_anything_runs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from benchmarks.learn.run import main

    with pytest.raises(SystemExit) as exited:
        main([str(ROOT / "examples" / "cartpole.yaml"), "--mode", "cluster", "--evaluators", "0"])
    assert exited.value.code == 2
    assert "--evaluators must be at least 1" in capsys.readouterr().err


def _processes_of_job(name: str) -> list[int]:
    """Pids of this user's processes started for job ``name`` (their env says RLKUBE_JOB_NAME=name)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:  # gone, or someone else's
            continue
        if f"RLKUBE_JOB_NAME={name}".encode() in environ:
            found.append(int(proc.name))
    return found


@pytest.mark.slow
def test_a_tiny_learn_bench_runs_rlkube_in_process_and_as_a_local_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from benchmarks.learn.run import main

    name = f"learnbench-{os.getpid()}"  # its processes and shm directories are found by this name
    out = tmp_path / "curves.json"
    argv = [
        str(ROOT / "examples" / "cartpole.yaml"),
        "--mode",
        "both",
        "--peer",
        "none",
        "--seeds",
        "1",
        "--steps",
        "2048",
        "--evaluators",
        "2",
        "--set",
        f"metadata.name={name}",
        "--set",
        "spec.trainer.replicas=1",
        "--json",
        str(out),
    ]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    rows = [line.split() for line in printed.splitlines()]
    assert any(row[:1] == ["rlkube-cluster"] for row in rows)  # its row in the final-return table
    assert any(row[:1] == ["rlkube"] for row in rows)
    runs = {r["side"]: r for r in json.loads(out.read_text())["runs"]}
    assert set(runs) == {"rlkube", "rlkube-cluster"}
    cluster = runs["rlkube-cluster"]
    assert cluster["env_steps"] == 2048  # 2 epochs of stepsPerEpoch 1024
    stamps = [steps for steps, _ in cluster["episodes"]]
    assert stamps, "the cluster run recorded no episode"
    assert stamps == sorted(stamps)
    assert set(stamps) <= {1024, 2048}  # each stamped with the env steps at the end of its epoch
    assert all(ret >= 1.0 for _, ret in cluster["episodes"])  # raw CartPole returns: 1 per step
    assert cluster["wall_seconds"] > 0
    assert cluster["startup_seconds"] > 0
    assert _processes_of_job(name) == []
    assert list(Path("/dev/shm").glob(f"rlkube-{name}-*")) == []


@pytest.mark.slow
def test_ctrl_c_stops_the_cluster_runs_processes_and_leaves_no_shm_or_run_directory(tmp_path: Path) -> None:
    name = f"learnbench-int-{os.getpid()}"
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p), TMPDIR=str(scratch))
    command = [
        *(sys.executable, "-m", "benchmarks.cli", "learn", str(ROOT / "examples" / "cartpole.yaml")),
        *("--mode", "cluster", "--peer", "none", "--seeds", "1", "--steps", "10000000", "--evaluators", "1"),
        *("--set", f"metadata.name={name}", "--set", "spec.trainer.replicas=1"),
    ]
    bench = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while len(_processes_of_job(name)) < 2:  # the train rank and the eval worker have started
            assert bench.poll() is None, bench.communicate()
            assert time.monotonic() < deadline, "the cluster's processes never started"
            time.sleep(0.2)
        bench.send_signal(signal.SIGINT)
        _, err = bench.communicate(timeout=120)
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
    assert bench.returncode == 130, err[-3000:]
    assert "interrupted" in err
    assert _processes_of_job(name) == []
    assert list(Path("/dev/shm").glob(f"rlkube-{name}-*")) == []
    assert list(scratch.glob("rlkube-learn-*")) == []  # the temporary run directory is gone


def test_the_sb3_sac_peer_gets_the_same_schedule_and_hyperparameters() -> None:
    pytest.importorskip("stable_baselines3")
    from benchmarks.learn.sac_peer import sb3_sac_kwargs

    job = load_job(ROOT / "examples" / "pendulum-sac.yaml", ["spec.policy.algoCfg.updatesPerStep=0.5"])
    kwargs = sb3_sac_kwargs(job)
    spec = job.spec
    assert kwargs["train_freq"] == (spec.train.steps_per_epoch, "step")  # one env: an epoch per rollout
    assert kwargs["gradient_steps"] == spec.train.steps_per_epoch // 2
    assert kwargs["batch_size"] == spec.train.batch_size
    assert kwargs["buffer_size"] == spec.buffer.capacity
    assert kwargs["learning_rate"] == spec.policy.optim_cfg["lr"]
    assert kwargs["ent_coef"] == "auto_1.0"
    assert kwargs["policy_kwargs"]["net_arch"] == [256, 256]


def test_cleanrls_published_ppo_figure_is_shown_beside_ppo_jobs_only() -> None:
    from benchmarks.learn.run import published

    examples = ROOT / "examples"
    assert published(load_job(examples / "halfcheetah.yaml")) == (
        1442.6,
        46.0,
        "CleanRL ppo_continuous_action, 1M steps, v4",
    )
    assert published(load_job(examples / "halfcheetah-rsl.yaml")) is not None
    assert published(load_job(examples / "halfcheetah-sac.yaml")) is None
