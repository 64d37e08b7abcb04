"""A hung eval worker (SIGSTOP) is evicted: the trainer reclaims its slot and the job completes."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.runtime.cluster import LocalRun, write_job

pytestmark = pytest.mark.slow


def test_a_stopped_eval_worker_holding_a_pin_never_crashes_the_trainer(local_run, tmp_path: Path) -> None:
    run = LocalRun(
        write_job(
            tmp_path,
            train__maxEpochs=14,
            runPolicy__backoffLimit=0,  # one restart of rank 0 and the job fails
            policy__weightBuffer__pinTimeoutSeconds=2.0,
        ),
        tmp_path / "run",
    )
    local_run.append(run)
    before = run.wait_until(lambda s: s.epoch >= 2 and s.eval_workers == 2, timeout=240, what="epoch 2")
    hung = run.pid_of("small-eval-0")  # on the trainer's node: it reads (and pins) rank 0's slots
    os.kill(hung, signal.SIGSTOP)
    try:
        # Training goes on past the pinned slot: every second publish needs it.
        run.wait_until(lambda s: s.epoch >= before.epoch + 3, timeout=180, what="3 epochs while hung")
    finally:
        os.kill(hung, signal.SIGCONT)
    assert run.wait(timeout=300) == 0, run.output[1]
    summary = run.summary()
    assert summary["epochs"] == 14
    assert summary["fragments_trained"] == summary["fragments_acknowledged"]
    log = (run.run_dir / "logs" / "small-train-0.log").read_text()
    assert log.count("==== small-train-0 started") == 1  # rank 0 never restarted
    assert "reclaimed slot" in log
    assert f"pid {hung}" in log
