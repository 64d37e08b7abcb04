"""A running local cluster's train rank 0 and eval workers export the series of the dashboard."""

from __future__ import annotations

import math
import os
import signal
import time
from pathlib import Path

import pytest

from tests.metrics.scrape import scrape, value
from tests.runtime.cluster import LocalRun, write_job

pytestmark = pytest.mark.slow


def metrics_url(run: LocalRun, pod: str) -> str:
    return str(run.cluster()["pods"][pod]["metrics"])


def wait_for_restart(run: LocalRun, pod: str, old_pid: int, *, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        entry = run.cluster().get("pods", {}).get(pod)
        if entry and entry["pid"] != old_pid:
            url = str(entry["metrics"])
            try:
                scrape(url)
                return url
            except OSError:
                pass  # still importing: not serving yet
        assert run.proc.poll() is None, f"the run ended before {pod} came back"
        time.sleep(0.3)
    raise AssertionError(f"{pod} did not come back within {timeout:.0f} s")


def rolled_out_with_trained_weights(run: LocalRun, pod: str) -> bool:
    """Whether ``pod`` has sent a fragment and loaded weights of a trained version (1 or later)."""
    try:
        series = scrape(metrics_url(run, pod))
    except (OSError, KeyError):
        return False  # not in cluster.json (KeyError) or not serving (OSError) yet
    sent = series.get(("rlkube_eval_fragments_total", ()), 0.0)
    return sent > 0 and series.get(("rlkube_eval_loaded_version", ()), 0.0) >= 1


def wait_for_trained_weights(run: LocalRun, pods: tuple[str, ...], *, timeout: float) -> None:
    """Until every pod in ``pods`` has rolled out and loaded a trained version of the weights.

    A worker that started while only the initial weights (version 0) were published rolls out
    with them until its receiver brings a newer version; under load that can be after epoch 3.
    """
    deadline = time.monotonic() + timeout
    waiting = list(pods)
    while waiting and time.monotonic() < deadline:
        waiting = [pod for pod in waiting if not rolled_out_with_trained_weights(run, pod)]
        assert run.proc.poll() is None, f"the run ended before {waiting} loaded trained weights"
        if waiting:
            time.sleep(0.3)
    assert not waiting, f"{waiting} sent no fragment with trained weights within {timeout:.0f} s"


def test_rank_zero_and_eval_workers_export_progress_weights_and_trajectories(
    local_run, tmp_path: Path
) -> None:
    # async: lags are recorded; 2 nodes: small-eval-1 is node-1's receiver and fetches over gRPC.
    job = write_job(
        tmp_path,
        engine="async",
        train__maxEpochs=400,
        train__maxStaleness=2,
        evaluator__replicas=2,
    )
    run = LocalRun(job, tmp_path / "run", "--nodes", "2")
    local_run.append(run)
    # Both workers registered: under load node-1's worker can start after rank 0's third epoch.
    run.wait_until(
        lambda s: s.epoch >= 3 and s.eval_workers == 2, timeout=180, what="epoch 3 with both eval workers"
    )
    wait_for_trained_weights(run, ("small-eval-0", "small-eval-1"), timeout=120)

    train = scrape(metrics_url(run, "small-train-0"))
    epoch = value(train, "rlkube_train_epoch")
    assert 3 <= epoch <= 400
    assert value(train, "rlkube_train_max_epochs") == 400
    assert value(train, "rlkube_train_env_steps") >= epoch * 256
    assert value(train, "rlkube_train_steps_per_second") > 0
    assert value(train, "rlkube_train_weight_version") >= epoch
    assert value(train, "rlkube_train_eval_workers") == 2
    assert not math.isnan(value(train, "rlkube_train_mean_return"))
    acknowledged = value(train, "rlkube_fragments_acknowledged_total")
    assert acknowledged >= epoch * 256 / (4 * 16)  # 4 fragments of 4 envs x 16 steps per epoch
    assert value(train, "rlkube_fragments_in_flight") >= 0
    assert value(train, "rlkube_fragments_dropped_stale_total") >= 0
    trained = value(train, "rlkube_fragment_lag_count")
    assert 0 < trained <= acknowledged
    assert value(train, "rlkube_fragment_lag_bucket", le="2.0") == trained  # maxStaleness bounds every lag
    assert value(train, "rlkube_fragment_lag_bucket", le="+Inf") == trained
    # One initial publish plus one per epoch, each observed once committed and once announced.
    for stage in ("committed", "announced"):
        assert value(train, "rlkube_weights_publish_seconds_count", stage=stage) >= epoch + 1
        assert value(train, "rlkube_weights_publish_seconds_sum", stage=stage) > 0
    assert value(train, "rlkube_weights_fetch_served_seconds_count") >= 1  # node-1's receiver fetched
    assert value(train, "rlkube_weights_served_bytes_total") > 0

    local, remote = (scrape(metrics_url(run, pod)) for pod in ("small-eval-0", "small-eval-1"))
    for worker in (local, remote):
        assert (
            1
            <= value(worker, "rlkube_eval_loaded_version")
            <= value(scrape(metrics_url(run, "small-train-0")), "rlkube_train_weight_version")
        )
        assert value(worker, "rlkube_eval_env_steps_total") > 0
        assert value(worker, "rlkube_eval_fragments_total") > 0
        assert value(worker, "rlkube_eval_rollout_seconds_total") > 0
        assert 0 <= value(worker, "rlkube_eval_weight_wait_share") < 1
        assert value(worker, "rlkube_eval_rollout_steps_per_second") > 0
        assert value(worker, "rlkube_eval_restarts") == 0
    # node-0 reads rank 0's slots directly; node-1's elected receiver fetched over the network.
    assert value(local, "rlkube_weights_fetch_seconds_count") == 0
    assert value(remote, "rlkube_weights_fetch_seconds_count") >= 1
    assert value(remote, "rlkube_weights_fetched_bytes_total") > 0

    # A pod that dies and comes back counts the restart (its weight directory outlives the process).
    old_pid = run.pid_of("small-eval-0")
    os.kill(old_pid, signal.SIGKILL)
    restarted = scrape(wait_for_restart(run, "small-eval-0", old_pid, timeout=120))
    assert value(restarted, "rlkube_eval_restarts") == 1
    run.stop()
