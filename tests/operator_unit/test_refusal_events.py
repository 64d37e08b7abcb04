"""A rise in refused fragments or evicted eval pods becomes a Warning event naming the newest."""

from __future__ import annotations

from rlkube_operator.refusal_events import refusal_events

REFUSAL = {
    "worker": "intruder#3",
    "task": "e4-f2",
    "reason": "action holds 1 values outside Discrete(2) [0, 1] (e.g. 7)",
    "quarantined": False,
    "evicted": True,
}


def progress(**figures: object) -> dict[str, object]:
    return {"progress": figures}


def test_a_refused_fragment_and_an_evicted_pod_are_each_an_event_naming_worker_and_reason() -> None:
    before = progress(fragmentsRefused=2, workersEvicted=0)
    after = progress(fragmentsRefused=3, workersEvicted=1, refusals=[REFUSAL])
    events = refusal_events(before, after)
    assert [reason for reason, _ in events] == ["FragmentsRefused", "EvalPodEvicted"]
    assert "3 fragments refused, 0 quarantined" in events[0][1]
    assert "newest: intruder#3 task e4-f2: action holds 1 values outside Discrete(2)" in events[0][1]
    assert "1 eval pods evicted for refused fragments (newest: intruder)" in events[1][1]


def test_unchanged_or_restarted_counts_post_nothing() -> None:
    same = progress(fragmentsRefused=3, workersEvicted=1, refusals=[REFUSAL])
    assert refusal_events(same, same) == []
    assert refusal_events(same, progress(fragmentsRefused=0)) == []  # rank 0 restarted: counts start again
    assert refusal_events(None, progress()) == []


def test_a_quarantined_fragment_is_reported_too() -> None:
    events = refusal_events(progress(), progress(fragmentsQuarantined=1))
    assert events == [
        (
            "FragmentsRefused",
            "0 fragments refused, 1 quarantined (they do not fit the job's spaces, schema or finiteness)",
        )
    ]
