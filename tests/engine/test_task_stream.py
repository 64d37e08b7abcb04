"""An eval worker's TaskStream: the next task rides on each push's answer, pushes go out on sender
threads (at most ``credits`` unanswered), and every fragment is acknowledged exactly once."""

from __future__ import annotations

import threading
from pathlib import Path

from rlkube._proto import policy_group_pb2 as pb
from rlkube.coordinator.in_process import InProcessClient
from rlkube.coordinator.journal import AckJournal
from rlkube.coordinator.state import Coordinator
from rlkube.coordinator.wire import fragment_to_proto
from rlkube.engine.task_stream import TaskStream

from tests.engine.jobs import tiny_job
from tests.faults.test_acknowledged_is_durable import pushed_fragment


class CountingClient(InProcessClient):
    """The in-process transport, counting LeaseTask calls."""

    leases = 0

    def lease(self, worker_id: str, *, wait_seconds: float) -> pb.Task:
        self.leases += 1
        return super().lease(worker_id, wait_seconds=wait_seconds)


def test_a_worker_streams_fragments_with_one_round_trip_each_and_none_is_lost_or_doubled(
    tmp_path: Path,
) -> None:
    coordinator = Coordinator(tiny_job(), world_size=1)
    coordinator.journal = AckJournal(tmp_path, incarnation=coordinator.incarnation).open()
    coordinator.open_stream(min_version=0)
    client = CountingClient(coordinator)
    worker = coordinator.register(pod_name="eval-0", node_name="n", replica_index=0, num_envs=4).worker_id
    answers: list[pb.PushAck | None] = []
    stream = TaskStream(client, stop=threading.Event(), on_answer=lambda _, ack: answers.append(ack))
    stream.bind(worker)
    pushed: list[str] = []
    while len(pushed) < 3 * coordinator.buffer.capacity:
        if len(coordinator.buffer) >= coordinator.fragments_per_epoch:  # the trainer takes a step
            assert coordinator.wait_batch(timeout=60.0) is not None
        task = stream.next_task(wait_seconds=0.0)
        if task.kind != pb.Task.COLLECT:
            stream.flush()  # back-pressure: let the answers in flight land, then ask again
            continue
        message = fragment_to_proto(
            pushed_fragment(1.0), task_id=task.task_id, worker_id=worker, epoch=task.epoch
        )
        stream.push(message)
        pushed.append(task.task_id)
    stream.close()
    assert len(set(pushed)) == len(pushed)
    assert len(answers) == len(pushed)
    assert all(ack is not None and ack.accepted and not ack.duplicate for ack in answers)
    assert coordinator.progress.fragments == len(pushed)
    assert coordinator.journal.acknowledged == len(pushed)
    assert client.leases < len(pushed) // 2  # most tasks came with an acknowledgement


def test_tasks_brought_for_an_old_registration_are_dropped_when_the_worker_registers_again() -> None:
    coordinator = Coordinator(tiny_job(), world_size=1)
    coordinator.open_stream(min_version=0)
    client = InProcessClient(coordinator)
    first = coordinator.register(pod_name="eval-0", node_name="n", replica_index=0, num_envs=4).worker_id
    stream = TaskStream(client, stop=threading.Event())
    stream.bind(first)
    task = stream.next_task(wait_seconds=0.0)
    stream.push(fragment_to_proto(pushed_fragment(1.0), task_id=task.task_id, worker_id=first, epoch=0))
    stream.flush()  # its answer brought the next task, leased to ``first``
    second = coordinator.register(pod_name="eval-0", node_name="n", replica_index=0, num_envs=4).worker_id
    stream.bind(second)  # the restarted pod's registration replaced the first one, and its leases
    fresh = stream.next_task(wait_seconds=0.0)
    assert coordinator.board.holder(fresh.task_id) == second
    stream.close()
