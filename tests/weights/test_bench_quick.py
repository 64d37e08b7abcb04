"""``rlkube bench weights --quick`` runs end to end (so the benchmark cannot rot); no figure is asserted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.bench.cli import run_bench

REQUIRED = {"scenario", "method", "size_bytes", "readers", "seconds", "gbps"}


@pytest.mark.slow
def test_the_quick_weights_benchmark_runs_and_writes_one_row_per_measurement(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    before = set(Path("/dev/shm").glob("rlkube-bench-*"))
    proc = run_bench("weights", "--quick", "--json", str(out), timeout=540)
    rows = json.loads(out.read_text())["rows"]
    assert [r for r in rows if "error" in r] == []
    for row in rows:
        assert row.keys() >= REQUIRED
    methods = {(r["scenario"], r["method"]) for r in rows}
    assert {
        ("a", "rlkube"),
        ("b", "rlkube"),
        ("b", "rlkube-grpc"),
        ("b", "grpc-raw"),
        ("a", "memcpy-bound"),
    } <= methods
    assert any(r["method"] == "rlkube-rollout-blocked" and r["updates"] > 0 for r in rows)
    remote = [r for r in rows if r["scenario"] == "b" and r["method"] == "rlkube"]
    assert all(r["net_bytes_per_version"] > 0 for r in remote)
    # The raw streams' node has as many rolling readers as rlkube's, for every count measured.
    for peer in ("grpc-raw", "grpc-raw-copy"):
        raw = [r for r in rows if r["scenario"] == "b" and r["method"] == peer]
        assert {r["readers"] for r in raw} == {r["readers"] for r in remote}, peer
    assert "scenario (a)" in proc.stdout
    assert "per version in turns" in proc.stdout  # the (b) share over pairs, with its interval
    assert set(Path("/dev/shm").glob("rlkube-bench-*")) == before  # nothing left in shared memory


def test_the_bench_dispatcher_lists_benchmarks_and_rejects_unknown_ones(
    capsys: pytest.CaptureFixture,
) -> None:
    from benchmarks.cli import main

    assert main([]) == 2
    assert "weights" in capsys.readouterr().out
    assert main(["nope"]) == 2
    assert "unknown benchmark 'nope'" in capsys.readouterr().err


@pytest.mark.slow
def test_the_transport_benchmark_compares_the_fetch_with_both_raw_streams(tmp_path: Path) -> None:
    out = tmp_path / "transport.json"
    before = set(Path("/dev/shm").glob("rlkube-bench-*"))
    proc = run_bench("transport", "--megabytes", "8", "--rounds", "2", "--json", str(out), timeout=300)
    seconds = json.loads(out.read_text())["seconds"]
    assert set(seconds) == {
        "rlkube",
        "rlkube-grpc",
        "grpc-raw",
        "grpc-raw-copy",
        "tcp-recv-into",
        "tcp-recv-into-xxh3",
    }
    assert all(len(v) == 2 and min(v) > 0 for v in seconds.values())
    assert "grpc-raw-copy" in proc.stdout
    assert set(Path("/dev/shm").glob("rlkube-bench-*")) == before
