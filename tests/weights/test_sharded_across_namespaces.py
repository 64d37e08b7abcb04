"""Sharded across real nodes: a receiver in one network namespace fetches ranges from two train
ranks, each in a namespace of its own, and ends up with the trainer's exact weights.

The nodes are made by :func:`rlkube.launch.netns.link_local_nodes` (veth pairs, link-local
addresses; root only, skipped elsewhere); the processes on them are the Sharded benchmark's
(``benchmarks.weights.netns_nodes``): each rank a WeightPublisher, the receiver the elected
NodeReceiver's own thread, watching rank 0 as eval pods do.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
import torch
from rlkube.launch.netns import NetnsUnavailable, leftovers, link_local_nodes, unavailable_reason
from rlkube.weights.copies import buffer_checksum
from rlkube.weights.shm_reader import ShmReader

from benchmarks.weights.models import SPECS, advance_, make_state_dict
from benchmarks.weights.netns_nodes import ShardedNodes, sharded_nodes
from benchmarks.weights.sharded_netns import SIZES
from benchmarks.weights.sharded_netns import main as bench_main

SIZE = SIZES["4MB"]
CHUNK = 256 << 10  # ~16 chunks a version: each of the 2 range streams gets about 8


def skip_without_namespaces() -> None:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)


def expected_weights(version: int) -> dict[str, dict[str, torch.Tensor]]:
    """What both ranks hold at ``version`` (the benchmark's deterministic weights)."""
    state = make_state_dict(SPECS["transformer"](SIZE), seed=0)
    for _ in range(version):
        advance_(state)
    return state


def check_version(nodes: ShardedNodes, version: int, checksum: int) -> None:
    """The receiver's buffer holds ``version``: its bytes hash to ``checksum``, its tensors are the
    trainer's."""
    with ShmReader(nodes.receiver_dir, remove_on_close=False) as reader:
        snapshot = reader.acquire()
        assert snapshot is not None
        with snapshot:
            assert snapshot.key == (nodes.incarnation, version)
            assert buffer_checksum(snapshot.buffer.numpy().data, snapshot.meta.chunk_bytes) == checksum
            for module, params in expected_weights(version).items():
                for name, tensor in params.items():
                    assert torch.equal(snapshot.views[module][name], tensor), f"{module}.{name}"


@pytest.mark.slow  # three processes importing torch: 20-60 s on a busy machine
def test_a_receiver_in_a_third_namespace_gets_each_version_from_two_ranks_intact_and_nothing_is_left() -> (
    None
):
    skip_without_namespaces()
    try:
        with sharded_nodes(size=SIZE, mode="follow", streams=2, chunk_bytes=CHUNK) as nodes:
            tag = nodes.net.tag
            processes = [*nodes.ranks, nodes.receiver]
            assert len({node.namespace for node in nodes.net.nodes}) == 3  # a node each
            assert len(leftovers(tag)) == 3 + 3 + 1  # namespaces, host ends of the veths, the bridge
            served_before = [0, 0]
            for version in (1, 2):
                nodes.prepare(version)
                # Rank 1 commits first, so that its ranges are served by it (not by rank 0's fallback).
                nodes.ranks[1].ask(op="publish", version=version, timeout=120)
                published = nodes.ranks[0].ask(op="publish", version=version, timeout=120)
                got = nodes.receiver.ask(op="wait", version=version, seconds=120.0, timeout=150)
                assert got["version"] == version, got["errors"]
                assert got["checksum"] == published["checksum"]
                served = nodes.served()
                per_rank = [after - before for after, before in zip(served, served_before, strict=True)]
                served_before = served
                assert sum(per_rank) == published["total_bytes"]  # each byte fetched once
                assert min(per_rank) > 0, f"bytes served by rank 0, rank 1: {per_rank}"
                check_version(nodes, version, published["checksum"])
    except NetnsUnavailable as exc:
        pytest.skip(str(exc))
    assert leftovers(tag) == []
    assert all(process.proc.poll() is not None for process in processes)


def test_namespaces_are_removed_and_their_processes_killed_when_the_body_fails() -> None:
    skip_without_namespaces()
    started: list[subprocess.Popen[bytes]] = []
    tags: list[str] = []

    def fail_inside_the_namespaces() -> None:
        with link_local_nodes(2) as net:
            tags.append(net.tag)
            process = subprocess.Popen(
                ["ip", "netns", "exec", net.namespaces[0], "sh", "-c", "echo inside; exec sleep 600"],
                stdout=subprocess.PIPE,
            )
            started.append(process)
            assert process.stdout is not None
            assert process.stdout.readline() == b"inside\n"  # it runs in the namespace now
            raise RuntimeError("the body failed")

    try:
        with pytest.raises(RuntimeError, match="the body failed"):
            fail_inside_the_namespaces()
        assert started[0].wait(timeout=10) == -signal.SIGKILL
        assert leftovers(tags[0]) == []
    finally:
        for process in started:
            if process.poll() is None:
                process.kill()
                process.wait()


def test_the_benchmark_refuses_with_a_reason_without_root(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert bench_main(["--sizes", "4MB"]) == 2
    assert "cannot run: creating network namespaces needs root" in capsys.readouterr().err


def test_the_benchmark_refuses_with_a_reason_without_iproute2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setenv("PATH", str(tmp_path))  # no `ip`, no `tc`
    assert bench_main(["--sizes", "4MB"]) == 2
    assert "needs iproute2 (ip, tc not found)" in capsys.readouterr().err
