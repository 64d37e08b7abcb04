"""``rlkube bench rollout --quick`` runs end to end (so the benchmark cannot rot); no figure is asserted."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests.bench.cli import run_bench


@pytest.mark.slow
def test_the_quick_rollout_benchmark_measures_every_method_and_engine(tmp_path: Path) -> None:
    out = tmp_path / "rollout.json"
    before = set(Path("/dev/shm").glob("rlkube-bench-rollout-*"))
    proc = run_bench("rollout", "--quick", "--json", str(out), timeout=540)
    rows = json.loads(out.read_text())
    seen = {(r["method"], r["engine"], r["workers"]) for r in rows}
    assert {("bound", "-", 1), ("in-process", "sync", 1)} <= seen
    assert {("cluster", engine, workers) for engine in ("sync", "async") for workers in (1, 2)} <= seen
    for row in rows:
        assert row["env_steps"] > 0
        assert row["steps_per_second"] > 0
    assert all(0.0 <= r["weight_wait_fraction"] <= 1.0 for r in rows if r["method"] == "cluster")
    assert "vs bound" in proc.stdout
    if importlib.util.find_spec("ray") is not None:  # the peer runs where the bench extra is installed
        assert {("ray", "sync", 1), ("ray", "sync", 2)} <= seen
    assert set(Path("/dev/shm").glob("rlkube-bench-rollout-*")) == before
