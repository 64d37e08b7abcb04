"""A live coordinator on loopback, an honest worker and an engine loop, for hostile clients to attack.

The coordinator is the real one (``CoordinatorServer`` over a real gRPC port on 127.0.0.1, with
the job's credential enforced); the "engine" opens epochs and takes their batches the way train
rank 0 does; the honest worker registers, leases and pushes well-formed fragments over gRPC.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import grpc
import gymnasium as gym
import numpy as np
from rlkube._proto import policy_group_pb2 as pb
from rlkube.coordinator.client import CoordinatorError, PolicyGroupClient
from rlkube.coordinator.service import CoordinatorServer
from rlkube.coordinator.state import Coordinator
from rlkube.coordinator.wire import fragment_to_proto
from rlkube.data.fragment import Fragment
from rlkube.data.rollout_buffer import AddResult
from rlkube.data.spaces import TrajectorySpaces
from rlkube.security.credential import Credential, new_token
from rlkube.spec import parse_job
from tensordict import TensorDict

from benchmarks.auth.run import cartpole_trajectories
from tests.conftest import MINIMAL_JOB

NUM_ENVS = 2
STEPS = 4
JOB = {
    **MINIMAL_JOB,
    "spec": {
        **MINIMAL_JOB["spec"],
        "env": {"id": "CartPole-v1", "numEnvs": NUM_ENVS},
        "train": {
            "maxEpochs": 3,
            "stepsPerEpoch": NUM_ENVS * STEPS * 2,
            "batchSize": NUM_ENVS * STEPS,
            "fragmentLength": STEPS,
        },
    },
}


def trajectories(*, num_envs: int = NUM_ENVS, steps: int = STEPS, obs: int = 4) -> TensorDict:
    return cartpole_trajectories(num_envs, steps, obs)


def push_message(task: pb.Task, worker_id: str, data: TensorDict | None = None) -> pb.Fragment:
    return fragment_to_proto(
        Fragment(data=trajectories() if data is None else data),
        task_id=task.task_id,
        worker_id=worker_id,
        epoch=task.epoch,
    )


def register(client: PolicyGroupClient, pod: str) -> str:
    request = pb.RegisterRequest(role="eval", pod_name=pod, node_name="node-0", num_envs=NUM_ENVS)
    return client.register(request, retry_for=0.0).worker_id


def code_of(call) -> grpc.StatusCode | None:  # type: ignore[no-untyped-def]
    """The gRPC code a call is answered with (None: OK)."""
    try:
        call()
    except CoordinatorError as exc:
        return exc.code
    except grpc.RpcError as exc:
        return exc.code()
    return None


@dataclass
class LiveJob:
    coordinator: Coordinator
    server: CoordinatorServer
    credential: Credential
    address: str
    batches: list[list[str]] = field(default_factory=list)  # task ids of each epoch's batch

    def client(self, credential: Credential | None = None) -> PolicyGroupClient:
        return PolicyGroupClient(self.address, credential=credential or self.credential)

    def run_engine(self, epochs: int, *, timeout: float = 60.0) -> threading.Thread:
        """Train rank 0's loop: open each epoch, wait for its batch, record it; then finish."""

        def loop() -> None:
            for epoch in range(1, epochs + 1):
                self.coordinator.open_epoch(epoch=epoch, version=0)
                batch = self.coordinator.wait_batch(timeout=timeout)
                if batch is None:
                    self.coordinator.finish(phase="Failed", message=f"epoch {epoch} never filled")
                    return
                self.batches.append(list(batch.task_ids))
            self.coordinator.finish()

        thread = threading.Thread(target=loop, name="engine", daemon=True)
        thread.start()
        return thread

    def honest_worker(
        self, pod: str = "cartpole-eval-0", before_push: Callable[[pb.Task], None] | None = None
    ) -> tuple[threading.Thread, list[str]]:
        """Leases and pushes well-formed fragments until the job says STOP; the acked task ids.

        `before_push` runs while the worker holds each lease, so a test can act on a lease that
        is certainly still open.
        """
        acked: list[str] = []

        def loop() -> None:
            with self.client() as client:
                worker_id = register(client, pod)
                while True:
                    task = client.lease(worker_id, wait_seconds=1.0)
                    if task.kind == pb.Task.STOP:
                        return
                    if task.kind == pb.Task.COLLECT:
                        if before_push is not None:
                            before_push(task)
                        ack = client.push(push_message(task, worker_id), retry_for=5.0)
                        if ack.accepted and not ack.duplicate:
                            acked.append(task.task_id)

        thread = threading.Thread(target=loop, name="honest-worker", daemon=True)
        thread.start()
        return thread, acked


#: CartPole's spaces, as train rank 0 gives them to its coordinator (``launch.train.trajectory_spaces``).
CARTPOLE_SPACES = TrajectorySpaces.of(
    gym.spaces.Box(-np.inf, np.inf, (4,), np.float32), gym.spaces.Discrete(2), action_bounds=False
)


def arrivals(live: LiveJob) -> list[Fragment]:
    """The fragments rank 0's buffer takes from now on, in order (the buffer still takes them)."""
    arrived: list[Fragment] = []
    add = live.coordinator.buffer.add

    def keep(task_id: str, fragment: Fragment) -> AddResult:
        arrived.append(fragment)
        return add(task_id, fragment)

    live.coordinator.buffer.add = keep  # type: ignore[method-assign]
    return arrived


def live_job(**coordinator_args: object) -> Iterator[LiveJob]:
    credential = Credential.of_token(new_token())
    coordinator_args.setdefault("spaces", CARTPOLE_SPACES)
    coordinator = Coordinator(parse_job(JOB), **coordinator_args)  # type: ignore[arg-type]
    server = CoordinatorServer(coordinator, address="127.0.0.1:0", credential=credential).start()
    try:
        yield LiveJob(coordinator, server, credential, f"127.0.0.1:{server.port}")
    finally:
        coordinator.finish()
        server.stop(grace=0.5)
