"""A refused fragment, the worker that sent it and an evicted pod are in the RLJob's status.progress."""

from __future__ import annotations

from rlkube._proto import policy_group_pb2 as pb

from tests.status.test_progress_follows_the_proto import derived


def test_refused_fragments_their_workers_and_evictions_are_in_status_progress() -> None:
    refusal = pb.FragmentRefusal(
        worker="intruder#3",
        task="e4-f2",
        reason="action holds 1 values outside Discrete(2) [0, 1] (e.g. 7)",
        evicted=True,
    )
    message = pb.JobStatus(
        phase="Running", fragments_refused=3, fragments_quarantined=1, workers_evicted=1, refusals=[refusal]
    )
    progress = derived(message)["progress"]
    assert (progress["fragmentsRefused"], progress["fragmentsQuarantined"], progress["workersEvicted"]) == (
        3,
        1,
        1,
    )
    assert progress["refusals"] == [
        {
            "worker": "intruder#3",
            "task": "e4-f2",
            "reason": "action holds 1 values outside Discrete(2) [0, 1] (e.g. 7)",
            "quarantined": False,
            "evicted": True,
        }
    ]
