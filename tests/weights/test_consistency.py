"""Coordinator-side checks: fingerprint comparison and waiting for eval workers to load a version."""

from __future__ import annotations

import math
import threading

from rlkube.weights.consistency import (
    LoadTracker,
    WorkerLoad,
    compare_fingerprints,
    verify_eval_weight_consistency,
)

TRAIN = {"actor.w": 2.0, "actor.b": 0.5, "critic.w": 0.0}


def test_equal_fingerprints_are_consistent() -> None:
    report = verify_eval_weight_consistency(TRAIN, {"e1": dict(TRAIN), "e0": dict(TRAIN)})
    assert report.consistent
    assert report.checked == ("e0", "e1")


def test_a_relative_difference_above_rtol_is_a_mismatch_and_below_is_not() -> None:
    assert compare_fingerprints(TRAIN, {**TRAIN, "actor.w": 2.0019}, rtol=1e-3) == []
    [m] = compare_fingerprints(TRAIN, {**TRAIN, "actor.w": 2.01}, rtol=1e-3, worker_id="e0")
    assert (m.worker_id, m.param, m.train_norm, m.eval_norm) == ("e0", "actor.w", 2.0, 2.01)
    assert math.isclose(m.rel_error, 0.005)


def test_a_zero_norm_uses_the_floor_and_nan_is_always_a_mismatch() -> None:
    [m] = compare_fingerprints(TRAIN, {**TRAIN, "critic.w": 1e-3})
    assert m.rel_error > 1e4
    [m] = compare_fingerprints(TRAIN, {**TRAIN, "actor.b": float("nan")})
    assert m.param == "actor.b"


def test_a_parameter_missing_on_either_side_is_a_mismatch() -> None:
    evaluated = {"actor.w": 2.0, "actor.b": 0.5, "extra": 1.0}
    report = verify_eval_weight_consistency(TRAIN, {"e0": evaluated})
    assert not report.consistent
    assert sorted(m.param for m in report.mismatches) == ["critic.w", "extra"]
    assert "e0:critic.w train=0.0 eval=None" in report.summary()


def load(worker: str, version: int, fingerprint: dict | None = None, incarnation: str = "i1") -> WorkerLoad:
    return WorkerLoad(worker, "node-a", incarnation, version, dict(fingerprint or TRAIN))


def test_the_tracker_waits_until_every_worker_reports_the_newest_version() -> None:
    tracker = LoadTracker()
    tracker.register("e0", "node-a")
    tracker.register("e1", "node-b")
    tracker.published("i1", 1, TRAIN)
    assert not tracker.wait_for_eval_weight_update(timeout=0.01)
    assert tracker.lagging() == ["e0", "e1"]
    assert tracker.report(load("e0", 1), now=1.0) == (True, "1 eval workers match the trainer")
    waiter = threading.Thread(target=lambda: tracker.report(load("e1", 1), now=2.0))
    waiter.start()
    assert tracker.wait_for_eval_weight_update(timeout=10)
    waiter.join()
    assert tracker.verify_eval_weight_consistency(timeout=0).consistent
    assert tracker.node_versions() == {"node-a": (1, 2)}


def test_a_wrong_fingerprint_is_reported_at_once_and_by_verify() -> None:
    tracker = LoadTracker(rtol=1e-3)
    tracker.published("i1", 3, TRAIN)
    consistent, detail = tracker.report(load("e0", 3, {**TRAIN, "actor.w": 3.0}), now=0.0)
    assert not consistent
    assert "e0:actor.w" in detail
    report = tracker.verify_eval_weight_consistency(timeout=0)
    assert [(m.worker_id, m.param) for m in report.mismatches] == [("e0", "actor.w")]


def test_a_worker_still_behind_after_the_timeout_counts_as_a_mismatch_until_it_leaves() -> None:
    tracker = LoadTracker()
    tracker.published("i1", 2, TRAIN)
    tracker.report(load("e0", 2), now=0.0)
    tracker.report(load("e1", 1), now=0.0)
    report = tracker.verify_eval_weight_consistency(timeout=0.01)
    assert [(m.worker_id, m.param) for m in report.mismatches] == [("e1", "<version>")]
    tracker.forget("e1")
    assert tracker.verify_eval_weight_consistency(timeout=0).consistent


def test_a_new_incarnation_makes_older_loads_lag_even_with_higher_numbers() -> None:
    tracker = LoadTracker()
    tracker.report(load("e0", 9), now=0.0)
    tracker.published("i2", 1, TRAIN)
    assert tracker.lagging() == ["e0"]
    tracker.report(load("e0", 1, incarnation="i2"), now=1.0)
    assert tracker.lagging() == []
