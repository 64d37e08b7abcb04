"""The Lease decisions, by hand: who creates, takes, renews or waits, and what each writes."""

from __future__ import annotations

from rlkube_operator.leadership import (
    LeaseRecord,
    Observation,
    Step,
    claimed,
    decide,
    observe,
    released,
    renew_deadline,
    retry_period,
)

HELD_BY_B = LeaseRecord(holder="b", duration_s=10, acquire_time="t0", renew_time="t1", transitions=3)


def test_with_no_lease_the_replica_creates_it_as_the_first_holder() -> None:
    assert decide(None, "a", now=0.0) is Step.CREATE
    record = claimed(None, "a", duration_s=10, now="t")
    assert record == LeaseRecord(holder="a", duration_s=10, acquire_time="t", renew_time="t", transitions=0)


def test_a_standby_waits_while_the_holder_renews_and_takes_over_a_duration_after_the_last_change() -> None:
    seen = observe(None, HELD_BY_B, now=100.0)
    assert decide(seen, "a", now=109.9) is Step.WAIT
    # b renews: the record changes, the clock restarts from when a saw the change.
    renewed = LeaseRecord(holder="b", duration_s=10, acquire_time="t0", renew_time="t2", transitions=3)
    seen = observe(seen, renewed, now=105.0)
    assert seen.seen_at == 105.0
    assert decide(seen, "a", now=114.9) is Step.WAIT
    # b stops renewing: the same record read again keeps its first sighting.
    assert observe(seen, renewed, now=112.0) is seen
    assert decide(seen, "a", now=115.0) is Step.TAKE


def test_expiry_is_judged_on_the_standbys_clock_not_the_times_written_in_the_lease() -> None:
    # renewTime is long past by any wall clock; what counts is that a saw it only now.
    stale = LeaseRecord(
        holder="b",
        duration_s=10,
        acquire_time="1970-01-01T00:00:00.000000Z",
        renew_time="1970-01-01T00:00:01.000000Z",
        transitions=0,
    )
    assert decide(observe(None, stale, now=500.0), "a", now=500.0) is Step.WAIT


def test_a_released_lease_is_taken_at_once_and_counts_a_transition() -> None:
    free = released(HELD_BY_B, now="t3")
    assert (free.holder, free.duration_s, free.transitions) == ("", 1, 3)
    assert decide(observe(None, free, now=0.0), "a", now=0.0) is Step.TAKE
    taken = claimed(free, "a", duration_s=10, now="t4")
    assert (taken.holder, taken.acquire_time, taken.renew_time, taken.transitions) == ("a", "t4", "t4", 4)


def test_the_holder_renews_keeping_its_acquire_time_and_transitions() -> None:
    seen = Observation(HELD_BY_B, seen_at=0.0)
    assert decide(seen, "b", now=1_000.0) is Step.RENEW
    renewed = claimed(HELD_BY_B, "b", duration_s=10, now="t9")
    assert renewed == LeaseRecord(
        holder="b", duration_s=10, acquire_time="t0", renew_time="t9", transitions=3
    )


def test_taking_an_expired_lease_from_another_holder_counts_a_transition() -> None:
    taken = claimed(HELD_BY_B, "a", duration_s=10, now="t5")
    assert (taken.holder, taken.acquire_time, taken.transitions) == ("a", "t5", 4)


def test_the_spec_round_trips_and_an_empty_holder_is_written_as_none() -> None:
    assert LeaseRecord.from_spec(HELD_BY_B.as_spec()) == HELD_BY_B
    assert released(HELD_BY_B, now="t").as_spec()["holderIdentity"] is None
    assert LeaseRecord.from_spec(None) == LeaseRecord("", 0, "", "", 0)


def test_a_leader_gives_up_before_a_standby_may_take_over_and_renews_several_times_within_it() -> None:
    for duration in (3, 10, 15, 60):
        assert renew_deadline(duration) < duration
        assert retry_period(duration) * 3 <= renew_deadline(duration)
    assert (renew_deadline(15), retry_period(15)) == (10.0, 2.0)  # client-go's defaults
