"""Eval workers join, stay alive by heartbeat, leave, and a restarted pod replaces its old self."""

from __future__ import annotations

from rlkube.coordinator.membership import Membership


def register(members: Membership, pod: str, node: str = "n0", now: float = 0.0):
    return members.register(pod_name=pod, node_name=node, replica_index=0, num_envs=8, now=now)


def test_registered_worker_gets_a_unique_id() -> None:
    members = Membership()
    a, _ = register(members, "eval-0")
    b, _ = register(members, "eval-1")
    assert a.worker_id != b.worker_id
    assert len(members) == 2


def test_a_restarted_pod_replaces_its_previous_registration_at_once() -> None:
    members = Membership()
    old, _ = register(members, "eval-0")
    new, replaced = register(members, "eval-0", now=1.0)
    assert [d.worker_id for d in replaced] == [old.worker_id]
    assert old.worker_id not in members
    assert new.worker_id in members


def test_silent_workers_expire_after_the_lease() -> None:
    members = Membership(lease_seconds=10)
    quiet, _ = register(members, "eval-0")
    chatty, _ = register(members, "eval-1")
    members.touch(chatty.worker_id, now=9.0)
    gone = members.expire(now=10.5)
    assert [d.worker_id for d in gone] == [quiet.worker_id]
    assert chatty.worker_id in members


def test_heartbeat_from_an_unknown_worker_says_so() -> None:
    assert Membership().touch("nobody#1", now=0.0) is None
