"""The run-policy decisions both control planes share (operator status and ``rlkube run``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from rlkube import run_policy
from rlkube.run_policy import PodRestarts, RestartLedger

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def crash_on_a_cluster(ledger: RestartLedger, uids: dict[int, str], counts: dict[int, int]) -> RestartLedger:
    """One crash of a 4-rank group as pods show it: every rank's container restarts once."""
    for rank in counts:
        counts[rank] += 1
    return ledger.observe({uids[rank]: PodRestarts(rank, counts[rank]) for rank in counts})


def test_one_crash_of_a_four_rank_group_is_one_group_restart() -> None:
    uids = {rank: f"uid-{rank}" for rank in range(4)}
    counts = dict.fromkeys(range(4), 0)
    ledger = RestartLedger().observe({uids[r]: PodRestarts(r, 0) for r in range(4)})
    ledger = crash_on_a_cluster(ledger, uids, counts)
    assert ledger.group_restarts == 1
    ledger = crash_on_a_cluster(ledger, uids, counts)
    assert ledger.group_restarts == 2


def test_cluster_and_local_supervisor_count_the_same_crashes() -> None:
    uids = {rank: f"uid-{rank}" for rank in range(4)}
    counts = dict.fromkeys(range(4), 0)
    cluster = RestartLedger().observe({uids[r]: PodRestarts(r, 0) for r in range(4)})
    local = RestartLedger()
    limit = 5
    for crash in range(1, 8):
        cluster = crash_on_a_cluster(cluster, uids, counts)
        local = local.group_restarted(4)
        assert cluster.group_restarts == local.group_restarts == crash
        assert run_policy.backoff_exceeded(cluster.group_restarts, limit) is (crash > limit)


def test_a_replaced_pod_adds_to_its_ranks_total() -> None:
    ledger = RestartLedger().observe({"a": PodRestarts(1, 2)})
    ledger = ledger.observe({"a2": PodRestarts(1, 1)})  # the StatefulSet made a new pod for rank 1
    assert ledger.per_rank == {1: 3}
    assert ledger.group_restarts == 3


def test_a_rank_restarting_alone_counts_too() -> None:
    ledger = RestartLedger().observe({"a": PodRestarts(0, 0), "b": PodRestarts(1, 3)})
    assert ledger.group_restarts == 3


def test_periods_are_due_at_their_end_and_say_how_long_is_left() -> None:
    assert not run_policy.is_due(T0, 60, T0 + timedelta(seconds=59.9))
    assert run_policy.is_due(T0, 60, T0 + timedelta(seconds=60))
    assert run_policy.due_in(T0, 60, T0 + timedelta(seconds=45)) == 15.0
    assert run_policy.due_in(T0, 60, T0 + timedelta(seconds=90)) == 0.0
    assert run_policy.due_in(None, 60, T0) is None
    assert not run_policy.is_due(T0, None, T0 + timedelta(days=1))
