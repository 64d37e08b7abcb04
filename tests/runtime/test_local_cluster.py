"""`rlkube run` as a local cluster: elastic eval, failures of either role, async staleness, clean exits.

Each test starts real processes (train ranks and eval workers with the pod env contract, a
coordinator, shm buffers) and watches them from outside through GetStatus and cluster.json.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest
from rlkube.launch.local import sweep_stale_shm_roots

from tests.runtime.cluster import LocalRun, write_job
from tests.runtime.slow_env import ENV_ID as SLOW_ENV

#: Steps of 2 ms: an epoch of 512 steps takes at least 1 s with one worker, whatever the machine.
SLOW_STEPS = {"env__id": SLOW_ENV, "env__imports": ["tests.runtime.slow_env"]}

pytestmark = pytest.mark.slow


def wait_for_no_leftovers(run: LocalRun, *, timeout: float) -> None:
    """Pods that exit after their supervisor (env subprocesses, a reaped pod) get ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while run.leftovers() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not run.leftovers(), f"pods outlived their supervisor: {run.leftovers()}"


def start(local_run: list[LocalRun], tmp_path: Path, *args: str, **spec: object) -> LocalRun:
    run = LocalRun(write_job(tmp_path, **spec), tmp_path / "run", *args)
    local_run.append(run)
    return run


def test_scaling_eval_workers_mid_run_never_restarts_training_or_loses_a_fragment(
    local_run, tmp_path
) -> None:
    # 8 fragments an epoch, so that new workers join while it runs. The env's hold file is the
    # handshake: while it exists rollouts wait, so the run cannot end while the new workers start
    # (several seconds, up to a minute on a loaded machine); slow steps keep it going while it drains.
    hold = tmp_path / "hold"
    run = start(
        local_run,
        tmp_path,
        train__maxEpochs=80,
        train__stepsPerEpoch=512,
        evaluator__replicas=1,
        env__kwargs={"hold_file": str(hold)},
        **SLOW_STEPS,
    )
    run.wait_until(lambda s: s.epoch >= 2, timeout=180, what="epoch 2")
    hold.touch()
    run.scale(4)
    held = run.wait_until(lambda s: s.eval_workers == 4, timeout=120, what="4 eval workers")
    assert held.epoch < 80
    hold.unlink()
    run.scale(2)
    scaled_down = run.wait_until(lambda s: s.eval_workers == 2, timeout=120, what="2 eval workers")
    assert run.wait(timeout=300) == 0, run.output[1]
    summary = run.summary()
    assert summary["epochs"] == 80
    assert scaled_down.epoch < 80, "the scale-down happened after training had ended"
    # Every acknowledged fragment was trained on exactly once: none lost with the drained workers.
    assert summary["fragments_trained"] == summary["fragments_acknowledged"] == 80 * 8
    assert summary["fingerprints_consistent"] is True
    assert (run.run_dir / "logs" / "small-train-0.log").read_text().count("==== small-train-0 started") == 1
    coordinator_log = (run.run_dir / "logs" / "small-train-0.log").read_text()
    for pod in ("small-eval-2", "small-eval-3"):  # drained by the scale-down: they deregistered
        assert re.search(rf"eval worker {pod}#\d+ left \(SIGTERM\)", coordinator_log), pod


def test_a_killed_eval_worker_mid_epoch_does_not_stop_the_epoch(local_run, tmp_path) -> None:
    # 8 fragments an epoch and 2 workers: a worker is always in the middle of a leased fragment. Slow
    # steps: the run lasts long enough (over 15 s) for the killed pod to come back and join again.
    run = start(
        local_run,
        tmp_path,
        train__maxEpochs=40,
        train__stepsPerEpoch=512,
        evaluator__replicas=2,
        **SLOW_STEPS,
    )
    run.wait_until(lambda s: s.epoch >= 3, timeout=180, what="epoch 3")
    os.kill(run.pid_of("small-eval-1"), signal.SIGKILL)
    killed_at = run.status()
    assert run.wait(timeout=300) == 0, run.output[1]
    summary = run.summary()
    assert killed_at is not None
    assert killed_at.epoch < 40
    assert summary["epochs"] == 40
    assert summary["fragments_trained"] == summary["fragments_acknowledged"] == 40 * 8
    # The pod came back (as a StatefulSet's would) and joined again under a new worker id.
    assert (run.run_dir / "logs" / "small-eval-1.log").read_text().count("started at") == 2
    joined = re.findall(
        r"eval worker (small-eval-1#\d+) joined", (run.run_dir / "logs" / "small-train-0.log").read_text()
    )
    assert len(set(joined)) == 2


def test_a_killed_train_rank_makes_the_job_resume_from_the_last_checkpoint(local_run, tmp_path) -> None:
    run = start(
        local_run,
        tmp_path,
        train__maxEpochs=40,
        train__stepsPerEpoch=512,
        trainer__replicas=2,
        evaluator__replicas=2,
    )
    run.wait_until(lambda s: s.epoch >= 5, timeout=240, what="epoch 5")
    os.kill(run.pid_of("small-train-1"), signal.SIGKILL)
    # Rank 0 cannot finish another step without rank 1: what it reports now bounds the checkpoint.
    killed_at = run.status()
    assert run.wait(timeout=400) == 0, run.output[1]
    summary = run.summary()
    assert summary["epochs"] == 40
    assert killed_at is not None
    assert summary["resumed_from_epoch"] is not None
    assert 4 <= summary["resumed_from_epoch"] <= killed_at.epoch + 1
    log = (run.run_dir / "logs" / "small-train-0.log").read_text()
    # A multiple of saveInterval (2), or the epoch rank 0 saved at when the launcher stopped it
    # (SIGTERM) after rank 1 died, if it did so before being killed.
    stopped_at = re.findall(r"stopping at epoch (\d+) \(SIGTERM\); saving a checkpoint", log)
    assert summary["resumed_from_epoch"] % 2 == 0 or str(summary["resumed_from_epoch"]) in stopped_at
    assert "resumed from" in log
    assert log.count("==== small-train-0 started") == 2


def test_async_engine_trains_only_on_fragments_within_max_staleness(local_run, tmp_path) -> None:
    run = start(
        local_run, tmp_path, engine="async", train__maxEpochs=12, train__maxStaleness=1, evaluator__replicas=3
    )
    assert run.wait(timeout=300) == 0, run.output[1]
    summary = run.summary()
    assert summary["epochs"] == 12
    lags = {int(lag): count for lag, count in summary["lag_distribution"].items()}
    assert lags, "no lag recorded"
    assert max(lags) <= 1
    assert sum(lags.values()) == summary["fragments_trained"]
    assert summary["fragments_trained"] + summary["dropped_stale"] <= summary["fragments_acknowledged"]


def test_async_engine_with_vtrace_trains_on_every_fragment_across_processes(local_run, tmp_path) -> None:
    run = start(
        local_run,
        tmp_path,
        engine="async",
        train__maxEpochs=8,
        train__maxStaleness=0,
        train__staleFragments="vtrace",
        evaluator__replicas=3,
    )
    assert run.wait(timeout=300) == 0, run.output[1]
    summary = run.summary()
    assert summary["epochs"] == 8
    assert summary["dropped_stale"] == 0
    assert summary["fragments_used_share"] == 1.0
    lags = {int(lag): count for lag, count in summary["lag_distribution"].items()}
    assert sum(lags.values()) == summary["fragments_trained"]
    assert summary["corrected_stale"] == sum(count for lag, count in lags.items() if lag > 0)


def test_ctrl_c_stops_every_process_and_removes_the_shm_directories(local_run, tmp_path) -> None:
    run = start(local_run, tmp_path, train__maxEpochs=500)
    run.wait_until(lambda s: s.epoch >= 1, timeout=180, what="epoch 1")
    assert run.shm_root
    assert Path(run.shm_root).exists()
    os.killpg(run.proc.pid, signal.SIGINT)
    assert run.wait(timeout=120) == 130
    wait_for_no_leftovers(run, timeout=10)
    assert not Path(run.shm_root).exists()
    assert any(p.name.startswith("ckpt-") for p in (run.run_dir / "checkpoints").iterdir())


def test_a_supervisor_killed_with_sigkill_takes_every_pod_with_it(local_run, tmp_path) -> None:
    run = start(local_run, tmp_path, train__maxEpochs=500)
    run.wait_until(lambda s: s.epoch >= 1 and s.eval_workers == 2, timeout=180, what="epoch 1, 2 workers")
    assert len(run.seen_pids) >= 3  # every pod the run started (more if one was restarted)
    os.kill(run.proc.pid, signal.SIGKILL)  # no chance to stop anything itself
    run.proc.wait(timeout=30)
    wait_for_no_leftovers(run, timeout=60)  # they notice the death themselves (die_with_supervisor)
    # Its shm root stays (it was the supervisor's to remove) until the next local run sweeps it.
    assert run.shm_root
    assert Path(run.shm_root).exists()
    assert sweep_stale_shm_roots(Path(run.shm_root).parent) == [Path(run.shm_root)]


def test_a_run_that_keeps_failing_exits_non_zero_with_the_last_log_lines(local_run, tmp_path) -> None:
    run = start(
        local_run,
        tmp_path,
        policy__type="PPO",
        policy__algoCfg={"updateEpochs": 2, "gamma": 7.0},
        runPolicy__backoffLimit=0,
    )
    code = run.wait(timeout=120)
    assert code != 0
    assert "gamma" in run.output[1]
