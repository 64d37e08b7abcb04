"""The updater thread loads new weights on notify, never during a rollout step, in sync and async mode."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch

from tests.policy.toy import AsyncToyPolicy, FakeSource, ToyPolicy, env_ret, policy_spec


def eval_policy(cls: type[ToyPolicy] = ToyPolicy, **spec: str) -> tuple[ToyPolicy, FakeSource]:
    policy = cls(policy_spec(**spec), "eval")
    source = FakeSource()
    policy.attach_weight_source(source)
    policy.init_eval(env_meta=None)
    return policy, source


def test_sync_updates_never_overlap_a_rollout_step() -> None:
    policy, source = eval_policy()
    stop = threading.Event()

    def rollouts() -> None:
        while not stop.is_set():
            policy._rollout(env_ret())

    thread = threading.Thread(target=rollouts)
    thread.start()
    try:
        for _ in range(15):
            source.publish()
            policy.notify_update_weights()
            assert policy.wait_for_weight_update_done(timeout=10)
            assert policy.weight_version == source.version
    finally:
        stop.set()
        thread.join()
        policy.close()
    assert source.overlaps == 0
    assert source.commits == list(range(1, 16))
    assert policy.steps > 0
    assert torch.equal(policy.net.bias, torch.full((1,), 15.0))


def test_async_updates_wait_for_in_flight_requests() -> None:
    policy, source = eval_policy(AsyncToyPolicy, rollout_mode="async")
    loop = policy.event_loop
    assert loop is not None
    stop = threading.Event()

    async def client() -> None:
        while not stop.is_set():
            await policy._rollout_async(env_ret())

    async def clients() -> None:
        await asyncio.gather(*(client() for _ in range(4)))

    thread = threading.Thread(target=loop.run_until_complete, args=(clients(),))
    thread.start()
    try:
        for _ in range(10):
            source.publish()
            policy.notify_update_weights()
            assert policy.wait_for_weight_update_done(timeout=10)
            assert policy.weight_version == source.version
    finally:
        stop.set()
        thread.join(timeout=10)
        policy.close()
    assert source.overlaps == 0
    assert source.commits == list(range(1, 11))
    assert policy.steps > 0
    assert policy.num_requests == 0


def test_staging_runs_outside_the_gate_while_a_step_is_in_flight() -> None:
    policy, source = eval_policy()
    policy.hold_steps.clear()
    source.publish()
    thread = threading.Thread(target=policy._rollout, args=(env_ret(),))
    thread.start()
    assert policy.step_started.wait(timeout=10)
    policy.notify_update_weights()
    assert source.staged.wait(timeout=10)  # staged while the step is held in flight
    policy.hold_steps.set()
    assert policy.wait_for_weight_update_done(timeout=10)
    thread.join()
    policy.close()
    assert source.staged_during_step == 1  # the slow part overlapped the step...
    assert source.overlaps == 0  # ...the commit did not


def test_wait_reports_an_unfinished_update_and_then_its_completion() -> None:
    policy, source = eval_policy()
    source.stage_gate.clear()
    source.publish()
    policy.notify_update_weights()
    assert policy.wait_for_weight_update_done(timeout=0.05) is False
    source.stage_gate.set()
    assert policy.wait_for_weight_update_done(timeout=10) is True
    assert policy.weight_version == 1
    policy.close()
    assert source.closed


def test_a_notify_during_an_update_is_not_reported_done_by_the_older_cycle() -> None:
    policy, source = eval_policy()
    source.stage_gate.clear()
    source.publish()
    policy.notify_update_weights()  # cycle 1 blocks in stage
    source.publish()
    policy.notify_update_weights()  # arrives while cycle 1 is running
    source.stage_gate.set()
    assert policy.wait_for_weight_update_done(timeout=10)
    assert policy.weight_version == 2
    policy.close()


def test_a_failed_update_keeps_the_thread_and_the_old_weights() -> None:
    policy, source = eval_policy()
    source.publish()
    source.fail_next = True
    policy.notify_update_weights()
    assert policy.wait_for_weight_update_done(timeout=10)
    assert policy.weight_version == -1
    assert policy.last_update_error == "RuntimeError: torn snapshot"
    policy.notify_update_weights()
    assert policy.wait_for_weight_update_done(timeout=10)
    assert policy.weight_version == 1
    assert policy.last_update_error is None
    policy.close()


def test_strategy_none_starts_no_thread_and_notify_is_a_no_op() -> None:
    policy = ToyPolicy(policy_spec(strategy="None"), "eval")
    policy.init_eval(env_meta=None)
    assert policy._weight_updater is None
    policy.notify_update_weights()
    assert policy.wait_for_weight_update_done(timeout=0) is True
    policy.close()


def test_check_idle_waits_for_the_step_in_flight() -> None:
    policy, _ = eval_policy(strategy="None")
    policy.hold_steps.clear()
    gate = policy._rollout_gate.idle
    assert gate is not None
    waiting = threading.Event()
    wait_idle = gate.wait_idle

    def announced_wait_idle(*args: object, **kwargs: object) -> bool:
        waiting.set()  # check_idle() is waiting: now let the step finish
        return wait_idle(*args, **kwargs)  # type: ignore[arg-type]

    gate.wait_idle = announced_wait_idle  # type: ignore[method-assign]
    thread = threading.Thread(target=policy._rollout, args=(env_ret(),))
    thread.start()
    assert policy.step_started.wait(timeout=10)
    assert policy.in_step == 1
    releaser = threading.Thread(target=lambda: waiting.wait(timeout=10) and policy.hold_steps.set())
    releaser.start()
    policy.check_idle()
    assert policy.in_step == 0
    thread.join()
    releaser.join()
    policy.close()


def test_rollout_in_the_wrong_mode_is_a_clear_error() -> None:
    policy, _ = eval_policy(AsyncToyPolicy, rollout_mode="async", strategy="None")
    with pytest.raises(RuntimeError, match="use _rollout_async"):
        policy._rollout(env_ret())
    policy.close()
