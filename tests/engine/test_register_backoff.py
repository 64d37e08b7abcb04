"""An eval worker refused at registration for good backs off instead of asking in a tight loop.

Seen on the real control plane: a job's weight server bound the port picked for its coordinator
(both are gRPC servers, which bind with SO_REUSEPORT), so every Register answered UNIMPLEMENTED at
once and the worker logged 670,000 lines in five minutes.
"""

from __future__ import annotations

import threading
import time
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2_grpc
from rlkube.contract import Role, read_pod_env
from rlkube.engine.worker import EvalWorker
from rlkube.launch.local import Layout, Ports, pod_env
from rlkube.policy.builtin.ppo import PPO

from tests.engine.jobs import tiny_job


class CountCalls(grpc.ServerInterceptor):
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.times: list[float] = []
        self.third = threading.Event()

    def intercept_service(self, continuation: Any, handler_call_details: Any) -> Any:
        self.times.append(time.monotonic())
        self.calls.append(handler_call_details.method)
        if len(self.calls) >= 3:
            self.third.set()
        return continuation(handler_call_details)


def test_registering_with_a_server_that_is_not_a_coordinator_backs_off(tmp_path: Path) -> None:
    counter = CountCalls()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), interceptors=[counter])
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    job = tiny_job()
    layout = Layout(job=job, run_dir=tmp_path, shm_root=tmp_path / "shm", nodes=1, ports=Ports(1, port, (3,)))
    stop = threading.Event()
    worker = EvalWorker(job, read_pod_env(pod_env(layout, Role.EVAL, 0)), PPO, stop=stop)
    registering = threading.Thread(target=worker._register)
    try:
        registering.start()
        assert counter.third.wait(timeout=60), counter.calls
        # The pauses double from 0.5 s (a slow machine only lengthens them).
        first, second = (b - a for a, b in zip(counter.times[:2], counter.times[1:3], strict=True))
        assert first >= 0.5, f"a pause of {first:.3f} s: a tight loop"
        assert second >= 1.0, f"pauses {first:.3f} s, {second:.3f} s: not doubling"
        assert set(counter.calls) == {"/rlkube.v1.PolicyGroup/Register"}
    finally:
        stop.set()
        registering.join(timeout=30)
        worker.client.close()
        server.stop(grace=0)
    assert not registering.is_alive()
