"""Ports handed out before their servers bind them are never handed out twice.

The OS hands a port it just returned out again as soon as nothing listens on it (here: 34 repeats
in 1,000 picks), and two gRPC servers on one port both bind it (SO_REUSEPORT): a job whose weight
server got its coordinator's port answered every Register with UNIMPLEMENTED.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from rlkube.launch.local import Ports
from rlkube.launch.processes import free_port, free_ports
from rlkube_devcluster.kubelet.network_thread import NetworkThread
from rlkube_devcluster.kubelet.podnet import JobNetworks


def test_free_ports_are_distinct_and_never_one_excluded() -> None:
    ports = free_ports(500)
    assert len(set(ports)) == 500
    held = set(ports)
    for _ in range(500):
        port = free_port(exclude=held)
        assert port not in held
        held.add(port)


def test_a_local_runs_ports_are_distinct() -> None:
    for _ in range(100):
        ports = Ports.allocate(train_ranks=4)
        assert len({ports.master, ports.coordinator, *ports.weights}) == 6


def test_no_two_jobs_on_the_box_share_a_port_until_one_is_released(tmp_path: Path) -> None:
    async def allocate() -> None:
        networks = JobNetworks(tmp_path)
        try:
            jobs = [networks.ports("ns", f"job-{i}") for i in range(60)]
            for ports in jobs:
                for rank in range(3):
                    ports.weight(rank)
                for pod in (("train", "0"), ("eval", "0"), ("eval", "1")):
                    ports.metrics_port(pod)
            every = [p for ports in jobs for p in (ports.coordinator, ports.master)]
            every += [p for ports in jobs for p in (*ports.weights.values(), *ports.metrics.values())]
            assert len(every) == 60 * 8
            assert len(set(every)) == len(every)
            networks.release_all_but({("ns", "job-0")})
            assert networks.get("ns", "job-1") is None
            assert jobs[0].all() <= jobs[0].held  # the busy job still holds its ports
            assert not (jobs[1].all() & jobs[0].held)  # the released ones may be picked again
        finally:
            await networks.close()

    asyncio.run(allocate())


def test_a_job_that_just_started_on_one_agent_is_not_released_by_another(tmp_path: Path) -> None:
    # node-1 starts the job's first pod; node-0, with no pods, reports before node-1 does: the
    # job's ports stay, so its next pod gets the same coordinator port as the first.
    networks = NetworkThread(tmp_path)
    try:
        first = networks.ports("ns", "job", agent="node-1")
        networks.busy("node-0", set())
        assert networks.get("ns", "job") is first
        assert networks.ports("ns", "job", agent="node-1").coordinator == first.coordinator
        networks.busy("node-1", set())  # its pods are gone: now released
        assert networks.get("ns", "job") is None
    finally:
        networks.close()
