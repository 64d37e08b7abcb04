"""A worker that learns of a new incarnation of train rank 0 stops waiting for the old one at once."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from rlkube.contract import Role, read_pod_env
from rlkube.coordinator.service import CoordinatorServer
from rlkube.coordinator.state import Coordinator
from rlkube.engine.worker import EvalWorker, IncarnationChanged
from rlkube.launch.local import Layout, Ports, free_port, pod_env
from rlkube.policy.builtin.ppo import PPO

from tests.engine.jobs import tiny_job


class PlaneHoldingTheNewIncarnation:
    """The node's buffer already handed the model the new incarnation's weights (what the issue saw)."""

    def __init__(self, key: tuple[str, int]) -> None:
        self.key = key
        self.waits = 0

    def loaded_key(self) -> tuple[str, int]:
        return self.key

    def sync(self, policy: Any, *, min_version: int, incarnation: str | None, timeout: float, **kw: Any):
        stop, abandon = kw["stop"], kw["abandon"]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not stop.is_set() and not abandon():
            self.waits += 1
            stop.wait(0.01)
        return self.key


@pytest.fixture
def servers():
    """Coordinator servers started by a test (``servers.append``); all stopped afterwards."""
    started: list[CoordinatorServer] = []
    yield started
    for server in started:
        server.stop(grace=0)


def serve(servers: list[CoordinatorServer], port: int) -> CoordinatorServer:
    server = CoordinatorServer(Coordinator(tiny_job(), world_size=1), address=f"127.0.0.1:{port}").start()
    servers.append(server)
    return server


def test_a_worker_waiting_for_a_dead_incarnation_gives_up_its_task_and_registers_again(
    tmp_path: Path, servers: list[CoordinatorServer]
) -> None:
    port = free_port()
    job = tiny_job()
    layout = Layout(job=job, run_dir=tmp_path, shm_root=tmp_path / "shm", nodes=2, ports=Ports(1, port, (3,)))
    worker = EvalWorker(job, read_pod_env(pod_env(layout, Role.EVAL, 1)), PPO, stop=threading.Event())
    try:
        old = serve(servers, port).coordinator
        assert worker._register()
        assert worker.incarnation == old.incarnation
        # Rank 0 dies and comes back: a new coordinator, a new incarnation, on the same address.
        servers[0].stop(grace=0)
        new = serve(servers, port).coordinator
        plane = PlaneHoldingTheNewIncarnation((new.incarnation, 1))
        with pytest.raises(IncarnationChanged, match=f"incarnation {old.incarnation} is gone"):
            worker._load(None, plane, 11)  # type: ignore[arg-type]  # v11 of the old incarnation
        assert not worker._registered.is_set()  # the worker registers again before its next task
        assert worker._register()
        assert worker.incarnation == new.incarnation
        assert worker.min_version == 0  # version numbers of the new incarnation start again
    finally:
        worker.client.close()
