"""What ``rlkube run`` prints at the end of a local-cluster run, from the run's summary.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rlkube._proto import policy_group_pb2 as pb
from rlkube.engine.report import RunSummary
from rlkube.engine.run_paths import RunPaths
from rlkube.launch.cluster_run import describe_status, report
from rlkube.launch.local import Outcome


def _finished_run(tmp_path: Path, **details: object) -> RunPaths:
    paths = RunPaths(tmp_path / "run").create()
    summary = RunSummary(
        job="cartpole",
        final_return=480.0,
        env_steps=40_960,
        epochs=20,
        wall_seconds=30.0,
        weight_version=20,
        stop_reason="max_epochs",
        fingerprints_consistent=True,
        engine="async",
        fingerprint_checks=21,
        details=dict(details),
    )
    paths.summary.write_text(json.dumps(summary.to_json()))
    return paths


def test_the_report_says_how_long_eval_workers_waited_for_weights_and_what_was_stale(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = _finished_run(tmp_path, weight_wait_fraction=0.0731, fragments_acknowledged=160, dropped_stale=3)
    assert report(Outcome(0), paths, None) == 0
    out = capsys.readouterr().out
    assert "train/eval fingerprints consistent over 21 versions" in out
    assert "160 fragments; eval workers waited for weights 7.3% of their rollout time" in out
    assert "3 fragments dropped as stale" in out


def test_the_report_says_how_many_stale_fragments_v_trace_corrected_and_the_share_used(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = _finished_run(
        tmp_path,
        weight_wait_fraction=0.01,
        fragments_acknowledged=160,
        dropped_stale=0,
        corrected_stale=41,
        fragments_used_share=1.0,
    )
    assert report(Outcome(0), paths, None) == 0
    out = capsys.readouterr().out
    assert "41 stale fragments corrected with V-trace; 100% of fragments used" in out
    assert "dropped as stale" not in out


def test_a_failed_run_reports_its_message_on_stderr_and_its_exit_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = RunPaths(tmp_path / "run").create()
    assert report(Outcome(3, "train-0 failed 4 times"), paths, None) == 3
    captured = capsys.readouterr()
    assert "train-0 failed 4 times" in captured.err
    assert captured.out == ""


def test_the_report_names_each_refused_fragment_its_worker_and_the_evicted_pod(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    refusal = {
        "worker": "intruder#3",
        "task": "e4-f2",
        "reason": "action holds 1 values outside Discrete(2) [0, 1] (e.g. 7)",
        "quarantined": False,
        "evicted": True,
    }
    paths = _finished_run(
        tmp_path,
        fragments_refused=3,
        fragments_quarantined=0,
        workers_evicted=["intruder"],
        refusals=[refusal],
    )
    assert report(Outcome(0), paths, None) == 0
    out = capsys.readouterr().out
    assert "3 fragments refused at the edge, 0 quarantined" in out
    assert (
        "refused: intruder#3 task e4-f2: action holds 1 values outside Discrete(2) [0, 1] (e.g. 7);"
        " its pod was evicted"
    ) in out
    assert "evicted     eval pod intruder" in out


def test_the_status_line_counts_refusals_and_names_the_newest() -> None:
    refusal = pb.FragmentRefusal(worker="intruder#3", task="e4-f2", reason="action holds 1 values outside")
    status = pb.JobStatus(epoch=4, max_epochs=12, fragments_refused=2, workers_evicted=1, refusals=[refusal])
    line = describe_status(status)
    assert (
        "refused 2, quarantined 0 (newest: intruder#3 e4-f2: action holds 1 values outside), 1 evicted"
        in line
    )
