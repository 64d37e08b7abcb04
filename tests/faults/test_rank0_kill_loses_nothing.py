"""Killing train rank 0 loses no acknowledged fragment, and the summary proves it across incarnations."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.runtime.cluster import LocalRun, write_job
from tests.runtime.slow_env import ENV_ID as SLOW_ENV

pytestmark = pytest.mark.slow


# The handshake that puts the kill mid-run however fast the machine (a quiet one trains 12 epochs
# in a few seconds, faster than a status poll can be sure to see one) and however the tasks fall
# between the workers: every env of the run takes its steps from one budget of 23 fragments'
# worth (a fragment is 16 steps of a worker's 4 envs), then holds until the test releases it. A
# worker stopped mid-fragment leaves at most one fragment unfinished (the spent steps are a
# whole number of fragments), so 22 or 23 fragments arrive: epoch 5 (20 fragments) is trained,
# epoch 6 (24) is not; past the checkpoint of epoch 4 and before that of epoch 8.
def held_mid_run(tmp_path: Path, release: Path) -> dict[str, object]:
    return {
        "step_budget": 23 * 4 * 16,
        "budget_file": str(tmp_path / "steps-spent"),
        "release_file": str(release),
    }


def test_no_acknowledged_fragment_is_lost_or_collected_twice_over_a_rank_0_kill(
    local_run, tmp_path: Path
) -> None:
    epochs = 12
    release = tmp_path / "release"
    job = write_job(
        tmp_path,
        train__maxEpochs=epochs,
        train__saveInterval=4,
        runPolicy__backoffLimit=2,
        env__id=SLOW_ENV,
        env__imports=["tests.runtime.slow_env"],
        env__kwargs=held_mid_run(tmp_path, release),
    )
    run = LocalRun(job, tmp_path / "run")
    local_run.append(run)
    # Past the checkpoint of epoch 4, with trained and acknowledged fragments it does not hold.
    held = run.wait_until(lambda s: s.epoch >= 5, timeout=300, what="epoch 5")
    assert held.epoch < 8  # the envs hold before the next checkpoint
    os.kill(run.pid_of("small-train-0"), signal.SIGKILL)
    release.touch()
    assert run.wait(timeout=400) == 0, run.output[1]
    summary = run.summary()
    per_epoch = 256 // (4 * 16)  # stepsPerEpoch / (numEnvs * fragmentLength)
    assert summary["epochs"] == epochs
    assert len(summary["incarnations"]) == 2
    # Every fragment any incarnation acknowledged was trained on once in the surviving history.
    assert summary["fragments_acknowledged_total"] == summary["fragments_trained_total"] == epochs * per_epoch
    assert summary["fragments_replayed"] > 0  # acknowledged after the last checkpoint, taken back
    assert sum(i["acknowledged"] for i in summary["incarnations"].values()) == epochs * per_epoch


def test_the_async_engine_loses_no_acknowledged_fragment_over_a_rank_0_kill(
    local_run, tmp_path: Path
) -> None:
    steps = 12
    release = tmp_path / "release"  # the handshake, as above
    job = write_job(
        tmp_path,
        engine="async",
        train__maxEpochs=steps,
        train__saveInterval=4,
        train__maxStaleness=1000,  # nothing is dropped as stale: every fragment must be trained on
        runPolicy__backoffLimit=2,
        env__id=SLOW_ENV,
        env__imports=["tests.runtime.slow_env"],
        env__kwargs=held_mid_run(tmp_path, release),
    )
    run = LocalRun(job, tmp_path / "run")
    local_run.append(run)
    held = run.wait_until(lambda s: s.epoch >= 5, timeout=300, what="step 5")  # past the checkpoint of step 4
    assert held.epoch < 8
    os.kill(run.pid_of("small-train-0"), signal.SIGKILL)
    release.touch()
    assert run.wait(timeout=400) == 0, run.output[1]
    summary = run.summary()
    per_step = 256 // (4 * 16)
    assert summary["epochs"] == steps
    assert len(summary["incarnations"]) == 2
    assert summary["fragments_trained_total"] == steps * per_step
    assert summary["fragments_dropped_total"] == 0
    assert summary["fragments_replayed"] > 0  # taken after the last checkpoint or still queued: back
    # Every acknowledged fragment was trained on once, or was still queued when the run ended.
    assert summary["fragments_acknowledged_total"] == (
        summary["fragments_trained_total"] + summary["fragments_queued_at_end"]
    )
    assert (
        sum(i["acknowledged"] for i in summary["incarnations"].values())
        == (summary["fragments_acknowledged_total"])
    )
