"""An acknowledged fragment the trainer cannot take is quarantined when it is taken back from the journal.

The first coordinator here has no spaces to check against (as one that predates the check), so
it acknowledges and journals a fragment with action 7 for CartPole's two actions; the next
incarnation, which knows the spaces, takes the journal back: the good fragment is trained, the
poisoned one is moved with a note to the run's quarantine directory, and its task is collected
again, so the epoch still has every fragment it plans.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rlkube.coordinator.edge import Refused
from rlkube.coordinator.journal import AckJournal
from rlkube.coordinator.refusals import EVICT_AFTER_REFUSALS
from rlkube.coordinator.state import Coordinator
from rlkube.coordinator.tasks import TaskSpec
from rlkube.data.fragment import Fragment
from rlkube.spec import parse_job

from tests.security.live import CARTPOLE_SPACES, JOB, NUM_ENVS, trajectories


def coordinator(run: Path, incarnation: str, *, spaces: bool = True) -> Coordinator:
    journal = AckJournal(run / "checkpoints" / "acknowledged", incarnation=incarnation).open()
    return Coordinator(
        parse_job(JOB),
        incarnation=incarnation,
        journal=journal,
        spaces=CARTPOLE_SPACES if spaces else None,
    )


def collect(coord: Coordinator, pod: str, *, poisoned: int = 0) -> list[str]:
    """A worker of ``pod`` pushes every queued task of the epoch, the first ``poisoned`` with action 7."""
    worker = coord.register(pod_name=pod, node_name="n0", replica_index=0, num_envs=NUM_ENVS)
    pushed = []
    while (task := coord.lease(worker.worker_id, wait_seconds=0)) is not None:
        assert isinstance(task, TaskSpec)
        data = trajectories()
        if len(pushed) < poisoned:
            data["action"][1, 0] = 7
        assert coord.push(task_id=task.task_id, worker_id=worker.worker_id, fragment=Fragment(data)).accepted
        pushed.append(task.task_id)
    return pushed


def test_a_journalled_fragment_outside_the_spaces_is_quarantined_and_its_task_collected_again(
    tmp_path: Path,
) -> None:
    old = coordinator(tmp_path, "first", spaces=False)
    old.open_epoch(epoch=1, version=0)
    pushed = collect(old, "eval-0", poisoned=1)
    assert len(pushed) == old.fragments_per_epoch == 2  # both acknowledged: nothing checked the action

    new = coordinator(tmp_path, "second")  # rank 0 restarted, before the step took them
    new.open_epoch(epoch=1, version=0)
    assert len(new.buffer) == 1  # the good one is taken back
    assert new.board.pending() == 1  # the poisoned one's place is collected again
    [note_file] = (tmp_path / "quarantine").glob("*.json")
    note = json.loads(note_file.read_text())
    assert note["worker"] == "eval-0#1"
    assert note["task"] == pushed[0].rsplit(".", 1)[0]
    assert "action holds 1 values outside Discrete(2)" in note["reason"]
    assert (tmp_path / "quarantine" / note["journal_entry"]).is_file()  # the bytes, for inspection
    assert new.journal.held() == {1: 1}  # dropped from the journal
    assert AckJournal(new.journal.directory, incarnation="third").open().held() == {1: 1}  # for good
    summary = new.refusal_summary()
    assert (summary["fragments_quarantined"], summary["fragments_refused"]) == (1, 0)
    assert summary["refusals"][0]["quarantined"]

    collect(new, "eval-1")
    batch = new.wait_batch(timeout=1.0)
    assert batch is not None
    assert len(batch.fragments) == new.fragments_per_epoch

    # Quarantined for good: a later incarnation takes back only what the journal still holds.
    third = coordinator(tmp_path, "third")
    third.open_epoch(epoch=1, version=0)
    assert len(third.buffer) == 2
    assert third.refusal_summary()["fragments_quarantined"] == 1  # counted over the run's life


def test_quarantined_fragments_count_against_their_pod_which_is_evicted_and_barred(tmp_path: Path) -> None:
    old = coordinator(tmp_path, "first", spaces=False)
    epochs = range(1, EVICT_AFTER_REFUSALS // old.fragments_per_epoch + 2)
    for epoch in epochs:
        old.open_epoch(epoch=epoch, version=0)
        collect(old, "eval-0", poisoned=old.fragments_per_epoch)
        old.wait_batch(timeout=1.0)
    new = coordinator(tmp_path, "second")
    new.register(pod_name="eval-0", node_name="n0", replica_index=0, num_envs=NUM_ENVS)
    for epoch in epochs:
        new.open_epoch(epoch=epoch, version=0)
    summary = new.refusal_summary()
    assert summary["workers_evicted"] == ["eval-0"]
    assert new.live_workers() == 0
    with pytest.raises(Refused, match="pod eval-0 was evicted"):
        new.register(pod_name="eval-0", node_name="n0", replica_index=0, num_envs=NUM_ENVS)


def test_a_poisoned_fragment_acknowledged_in_a_stream_is_quarantined_when_the_stream_reopens(
    tmp_path: Path,
) -> None:
    old = coordinator(tmp_path, "first", spaces=False)
    old.open_stream(min_version=0)
    worker = old.register(pod_name="eval-0", node_name="n0", replica_index=0, num_envs=NUM_ENVS)
    for poison in (True, False):
        task = old.lease(worker.worker_id, wait_seconds=0)
        assert isinstance(task, TaskSpec)
        data = trajectories()
        if poison:
            data["action"][0, 3] = 7
        assert old.push(task_id=task.task_id, worker_id=worker.worker_id, fragment=Fragment(data)).accepted

    new = coordinator(tmp_path, "second")  # async: nothing was taken by a step yet
    new.open_stream(min_version=0, step=0)
    assert new.replayed == 1
    assert new.acknowledged_and_queued()[1] == 1
    [note] = (tmp_path / "quarantine").glob("*.json")
    assert "action holds 1 values outside Discrete(2)" in json.loads(note.read_text())["reason"]
