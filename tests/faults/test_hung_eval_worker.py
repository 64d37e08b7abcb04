"""A hung eval worker (SIGSTOP) is evicted: the trainer reclaims its slot and the job completes."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.runtime.cluster import LocalRun, write_job
from tests.runtime.slow_env import ENV_ID as SLOW_ENV

pytestmark = pytest.mark.slow

MAX_EPOCHS = 30


def test_a_stopped_eval_worker_holding_a_pin_never_crashes_the_trainer(local_run, tmp_path: Path) -> None:
    # The slow env's hold file is the handshake: while it exists every rollout step waits, so the
    # run cannot end (on a quiet machine 14 plain CartPole epochs take 2 s) before the worker hangs.
    hold = tmp_path / "hold"
    run = LocalRun(
        write_job(
            tmp_path,
            train__maxEpochs=MAX_EPOCHS,
            runPolicy__backoffLimit=0,  # one restart of rank 0 and the job fails
            policy__weightBuffer__pinTimeoutSeconds=2.0,
            env__id=SLOW_ENV,
            env__imports=["tests.runtime.slow_env"],
            env__kwargs={"hold_file": str(hold)},
        ),
        tmp_path / "run",
    )
    local_run.append(run)
    run.wait_until(lambda s: s.epoch >= 2 and s.eval_workers == 2, timeout=240, what="epoch 2")
    hold.touch()
    before = run.status()
    assert before is not None
    assert before.epoch < MAX_EPOCHS
    hung = run.pid_of("small-eval-0")  # on the trainer's node: it reads (and pins) rank 0's slots
    os.kill(hung, signal.SIGSTOP)  # in a held step, with its pin on the slot of the version it acts with
    hold.unlink()
    try:
        # Training goes on past the pinned slot: every second publish needs it.
        run.wait_until(lambda s: s.epoch >= before.epoch + 3, timeout=180, what="3 epochs while hung")
    finally:
        os.kill(hung, signal.SIGCONT)
    assert run.wait(timeout=300) == 0, run.output[1]
    summary = run.summary()
    assert summary["epochs"] == MAX_EPOCHS
    assert summary["fragments_trained"] == summary["fragments_acknowledged"]
    log = (run.run_dir / "logs" / "small-train-0.log").read_text()
    assert log.count("==== small-train-0 started") == 1  # rank 0 never restarted
    assert "reclaimed slot" in log
    assert f"pid {hung}" in log
