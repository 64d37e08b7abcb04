"""The work board hands out each fragment once, reassigns a vanished worker's share, never counts twice."""

from __future__ import annotations

from rlkube.coordinator.tasks import AckResult, TaskBoard, TaskKind


def board_with_epoch(fragments: int = 4, version: int = 7) -> TaskBoard:
    board = TaskBoard(fragment_length=16)
    board.open_epoch(epoch=3, version=version, fragments=fragments)
    return board


def test_epoch_tasks_are_leased_once_each_with_the_epoch_version() -> None:
    board = board_with_epoch()
    tasks = [board.lease(f"w{i}") for i in range(4)]
    ids = [t.task_id for t in tasks if t]
    assert sorted(i.rsplit(".", 1)[0] for i in ids) == ["e3-f0", "e3-f1", "e3-f2", "e3-f3"]
    assert all(t is not None and t.min_version == 7 and t.steps == 16 for t in tasks)
    assert board.lease("w5") is None


def test_epoch_completes_when_every_fragment_is_acknowledged() -> None:
    board = board_with_epoch(fragments=2)
    first, second = board.lease("a"), board.lease("b")
    assert first
    assert second
    assert board.ack(first.task_id)[0] is AckResult.ACCEPTED
    assert not board.epoch_complete()
    assert board.ack(second.task_id)[0] is AckResult.ACCEPTED
    assert board.epoch_complete()


def test_a_second_push_of_the_same_task_is_a_duplicate_and_not_counted() -> None:
    board = board_with_epoch(fragments=2)
    task = board.lease("a")
    assert task
    board.ack(task.task_id)
    assert board.ack(task.task_id)[0] is AckResult.DUPLICATE
    assert board.acked_fragments() == 1


def test_a_departed_workers_lease_goes_back_to_the_front_of_the_queue() -> None:
    board = board_with_epoch(fragments=3)
    lost = board.lease("dead")
    assert lost
    assert board.release_worker("dead") == [lost.task_id]
    again = board.lease("alive")
    assert again == lost


def test_the_presumed_dead_worker_pushing_late_wins_once_and_the_requeued_copy_is_dropped() -> None:
    board = board_with_epoch(fragments=1)
    task = board.lease("slow")
    assert task
    board.release_worker("slow")
    assert board.ack(task.task_id)[0] is AckResult.ACCEPTED
    assert board.pending() == 0
    assert board.lease("other") is None
    assert board.epoch_complete()


def test_a_push_for_a_task_of_a_previous_epoch_is_unknown() -> None:
    board = board_with_epoch(fragments=1)
    old = board.lease("a")
    assert old
    board.open_epoch(epoch=4, version=8, fragments=1)
    assert board.ack(old.task_id)[0] is AckResult.UNKNOWN
    assert board.acked_fragments() == 0


def test_evaluation_tasks_go_ahead_of_collection_work() -> None:
    board = board_with_epoch(fragments=2)
    board.add_evaluation(epoch=3, version=7, episodes=5)
    task = board.lease("a")
    assert task
    assert task.kind is TaskKind.EVALUATE
    assert task.episodes == 5
    board.ack(task.task_id)
    assert board.acked_fragments() == 0


def test_stream_mode_mints_tasks_until_capacity_then_waits_for_the_trainer() -> None:
    board = TaskBoard(fragment_length=8)
    board.open_stream(capacity=2, min_version=0)
    first, second = board.lease("a"), board.lease("b")
    assert first
    assert second
    assert first.task_id != second.task_id
    assert board.lease("c") is None  # back-pressure: two in flight
    board.ack(first.task_id)
    assert board.lease("c") is None  # acknowledged but not yet trained on
    board.consumed(1)
    assert board.lease("c") is not None


def test_stream_mode_tasks_carry_the_current_minimum_version() -> None:
    board = TaskBoard(fragment_length=8)
    board.open_stream(capacity=4, min_version=0)
    board.set_stream_min_version(5)
    task = board.lease("a")
    assert task
    assert task.min_version == 5


def test_task_ids_are_unguessable_so_nobody_pushes_a_task_not_leased_to_them() -> None:
    first, second = board_with_epoch(fragments=2), board_with_epoch(fragments=2)
    ids = [t.task_id for board in (first, second) for t in (board.lease("a"), board.lease("b")) if t]
    assert len(set(ids)) == 4  # the same epoch and index never give the same id twice
    assert all(len(i.rsplit(".", 1)[1]) >= 12 for i in ids)


def test_the_board_knows_who_holds_a_task_and_whose_push_was_acknowledged() -> None:
    board = board_with_epoch(fragments=1)
    task = board.lease("a")
    assert task
    assert board.holder(task.task_id) == "a"
    board.ack(task.task_id, "a")
    assert board.holder(task.task_id) is None
    assert board.acked_by(task.task_id) == "a"
