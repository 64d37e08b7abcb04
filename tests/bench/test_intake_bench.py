"""``rlkube bench intake`` runs end to end and reports what it says it does; no figure is asserted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.rollout.intake import producer_cost
from tests.bench.cli import run_bench


def test_the_producers_cost_is_their_cpu_over_the_fragments_rank_0_acknowledged(tmp_path: Path) -> None:
    first, second, missing = tmp_path / "p0.json", tmp_path / "p1.json", tmp_path / "p2.json"
    first.write_text(json.dumps({"cpu_seconds": 0.3, "acknowledged": 200}))
    second.write_text(json.dumps({"cpu_seconds": 0.1, "acknowledged": 200}))
    # A producer that wrote nothing (killed) is left out, not counted as zero.
    assert producer_cost([first, second, missing]) == pytest.approx({"producer_cpu_ms_per_fragment": 1.0})
    assert producer_cost([missing]) == {}


@pytest.mark.slow
def test_the_intake_benchmark_reports_rank_0s_and_the_producers_cpu_per_fragment(tmp_path: Path) -> None:
    out = tmp_path / "intake.json"
    proc = run_bench(
        "intake", "--producers", "1", "--seconds", "1", "--warmup", "0.5", "--json", str(out), timeout=300
    )
    (row,) = json.loads(out.read_text())
    assert row["producers"] == 1
    assert row["journal"] is True
    assert row["fragments"] > 0
    assert row["fragments_per_second"] > 0
    assert row["rank0_cpu_ms_per_fragment"] > 0
    assert row["producer_cpu_ms_per_fragment"] > 0
    assert "producer cpu ms/frag" in proc.stdout
