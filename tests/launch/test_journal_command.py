"""``rlkube journal RUN_DIR`` tells what a restart would take back, and changes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
from rlkube.cli import main
from rlkube.coordinator.journal import JOURNAL_DIR, AckJournal
from rlkube.coordinator.wire import fragment_to_proto

from tests.faults.test_acknowledged_is_durable import pushed_fragment


def listing(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in sorted(root.rglob("*"))}


def test_the_journal_report_names_what_a_restart_takes_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "runs" / "cartpole-1"
    journal = AckJournal(run / "checkpoints" / JOURNAL_DIR, incarnation="first").open()
    for epoch in (0, 0, 1, 1):
        journal.record(epoch=epoch, fragment=pushed_fragment(float(epoch)))
    journal.record(epoch=None, fragment=pushed_fragment(9.0))
    journal.checkpointed(1)
    older = fragment_to_proto(pushed_fragment(5.0), task_id="t", worker_id="w#1", epoch=2)
    (journal.directory / "e000002-older-000001.frag").write_bytes(older.SerializeToString())
    before = listing(run)

    assert main(["journal", str(run)]) == 0
    out = capsys.readouterr().out
    assert "taken back by a restart: 3 fragments (step 1: 2, no step yet: 1)" in out
    assert "a checkpoint holds the steps below 1" in out
    assert "acknowledged, by incarnation: first: 5" in out
    assert "quarantined: 0" in out
    assert "1 entries of an older rlkube" in out
    assert listing(run) == before  # read only


def test_a_directory_without_a_journal_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["journal", str(tmp_path)]) == 1
    assert f"no journal at {tmp_path / 'checkpoints' / JOURNAL_DIR}" in capsys.readouterr().err
