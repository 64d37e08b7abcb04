"""``rlkube bench stale`` builds each variant from the one reference job, differing only where named."""

from __future__ import annotations

import pytest
from rlkube.jobfile import load_job
from rlkube.spec import Engine, StaleFragments, VtraceClipAnchor

from benchmarks.learn.stale import main, variant


def test_each_variant_sets_its_engine_stale_handling_and_clip_anchor_and_nothing_else() -> None:
    job = load_job("examples/cartpole.yaml", ["spec.buffer.capacity=4"])
    built = {name: variant(job, name, staleness=1) for name in ("sync", "drop", "vtrace", "vtrace-behaviour")}
    assert built["sync"].spec.engine is Engine.SYNC
    assert built["drop"].spec.train.stale_fragments is StaleFragments.DROP
    assert built["vtrace"].spec.train.vtrace_clip_anchor is VtraceClipAnchor.LEARNER
    assert built["vtrace-behaviour"].spec.train.stale_fragments is StaleFragments.VTRACE
    assert built["vtrace-behaviour"].spec.train.vtrace_clip_anchor is VtraceClipAnchor.BEHAVIOUR
    for run in built.values():
        assert run.spec.buffer.capacity == 4
        assert run.spec.policy == job.spec.policy


def test_an_unknown_variant_is_named() -> None:
    with pytest.raises(SystemExit):
        main(["--variants", "sync,vtrace-learner"])
