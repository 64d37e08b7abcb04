"""BasePolicy's updater thread with the shm weight source: gates, waits, views and copies."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest
import torch
from rlkube.envs.types import EnvRet, PolicyResponse
from rlkube.policy.weight_source import StagedWeights
from rlkube.weights.publisher import PublisherConfig, WeightPublisher
from rlkube.weights.sources import ShmWatcher, ShmWeightSource

from tests.weights.tiny import TinyPolicy, observation, tiny_policy


class WatchedSource(ShmWeightSource):
    """Marks the time it spends in commit(), so rollouts can check they never overlap it."""

    committing = False
    commits = 0

    def commit(self, policy, staged: StagedWeights) -> None:
        self.committing = True
        try:
            time.sleep(0.0002)  # widen the window a racing rollout would fall into
            super().commit(policy, staged)
            self.commits += 1
        finally:
            self.committing = False


class GatedTiny(TinyPolicy):
    """Records any rollout step that starts or ends while the weight source is committing."""

    overlaps = 0
    steps = 0

    def rollout_step(self, env_ret: EnvRet, **kwargs: object) -> PolicyResponse:
        source = self._weight_source
        if source.committing:
            self.overlaps += 1
        response = super().rollout_step(env_ret)
        time.sleep(0.00005)
        if source.committing:
            self.overlaps += 1
        self.steps += 1
        return response


class AsyncGatedTiny(GatedTiny):
    async def rollout_step(self, env_ret: EnvRet, **kwargs: object) -> PolicyResponse:  # type: ignore[override]
        source = self._weight_source
        if source.committing:
            self.overlaps += 1
        await asyncio.sleep(0.0005)  # other requests and the updater get their turn here
        response = PolicyResponse(env_id=env_ret.env_id, action=self.actor(env_ret.observation).argmax(-1))
        if source.committing:
            self.overlaps += 1
        self.steps += 1
        return response


def make_eval(cls: type, shm_dir: Path, *, rollout_mode: str = "sync", mode: str = "view"):
    template = tiny_policy("eval", rollout_mode=rollout_mode)
    policy = cls(template.config, "eval")
    source = WatchedSource(shm_dir, mode=mode).open()
    policy.attach_weight_source(source)
    return policy, source


def publish_versions(
    publisher: WeightPublisher, trainer: TinyPolicy, count: int, stop: threading.Event
) -> None:
    for _ in range(count):
        if stop.is_set():
            return
        trainer.train()
        publisher.send(trainer.get_trainable_parameters())


def test_a_sync_rollout_step_never_runs_during_a_commit(shm_dir: Path) -> None:
    trainer = tiny_policy("train")
    trainer.init_train()
    with WeightPublisher(PublisherConfig(shm_dir=shm_dir, slot_wait_timeout=20)) as publisher:
        publisher.send(trainer.get_trainable_parameters())
        policy, source = make_eval(GatedTiny, shm_dir)
        policy.init_eval()
        watcher = ShmWatcher(shm_dir, policy.notify_update_weights).start()
        stop = threading.Event()

        def roll() -> None:
            obs = observation()
            while not stop.is_set():
                policy._rollout(obs)

        rollers = [threading.Thread(target=roll) for _ in range(2)]
        for thread in rollers:
            thread.start()
        try:
            publish_versions(publisher, trainer, 300, stop)
            assert policy.wait_for_weight_update_done(timeout=20)
            deadline = time.monotonic() + 20
            while policy.weight_version != publisher.version and time.monotonic() < deadline:
                policy.notify_update_weights()
                policy.wait_for_weight_update_done(timeout=5)
        finally:
            stop.set()
            for thread in rollers:
                thread.join()
            watcher.close()
            policy.close()
    assert policy.overlaps == 0
    assert policy.steps > 100
    assert source.commits > 10
    assert policy.weight_version == 301
    assert len(policy.update_block_seconds) == source.commits


def test_an_async_rollout_never_runs_during_a_commit(shm_dir: Path) -> None:
    trainer = tiny_policy("train")
    trainer.init_train()
    loop = asyncio.new_event_loop()
    with WeightPublisher(PublisherConfig(shm_dir=shm_dir, slot_wait_timeout=20)) as publisher:
        publisher.send(trainer.get_trainable_parameters())
        policy, source = make_eval(AsyncGatedTiny, shm_dir, rollout_mode="async")
        ready = threading.Event()
        stop = threading.Event()

        async def clients() -> None:
            policy.init_eval()  # binds the running loop
            ready.set()

            async def client() -> None:
                obs = observation()
                while not stop.is_set():
                    await policy._rollout_async(obs)

            await asyncio.gather(*(client() for _ in range(4)))

        runner = threading.Thread(target=loop.run_until_complete, args=(clients(),))
        runner.start()
        assert ready.wait(10)
        try:
            for _ in range(40):
                for _ in range(2):  # back-to-back updates: the gate reopens and closes again at once
                    trainer.train()
                    publisher.send(trainer.get_trainable_parameters())
                    policy.notify_update_weights()
                assert policy.wait_for_weight_update_done(timeout=20)
                if policy.weight_version != publisher.version:
                    policy.notify_update_weights()
                    assert policy.wait_for_weight_update_done(timeout=20)
                assert policy.weight_version == publisher.version
        finally:
            stop.set()
            runner.join(10)
            policy.close()
            loop.close()
    assert policy.overlaps == 0
    assert policy.steps > 40
    assert source.commits >= 40


def test_an_async_request_keeps_waiting_when_the_gate_reopens_and_closes_before_it_resumes() -> None:
    """The race behind rollouts during commits: a waiter resumes after the next update closed the gate."""
    policy = tiny_policy("eval", strategy="None", rollout_mode="async")

    async def scenario() -> None:
        policy.init_eval()
        gate = policy._rollout_gate.admission
        gate.close_and_drain(timeout=0)  # an update is committing
        request = asyncio.ensure_future(policy._rollout_async(observation()))
        await asyncio.sleep(0)  # the request now waits at the gate
        gate.reopen()  # that update ends ...
        gate.close_and_drain(timeout=0)  # ... and the next one closes the gate before the request ran
        await asyncio.sleep(0.01)
        assert not request.done()
        assert policy.num_requests == 0
        gate.reopen()
        await request

    asyncio.run(scenario())


def test_wait_for_weight_update_done_returns_only_after_the_commit(shm_dir: Path) -> None:
    trainer = tiny_policy("train")
    trainer.init_train()
    with WeightPublisher(PublisherConfig(shm_dir=shm_dir)) as publisher:
        policy, _ = make_eval(GatedTiny, shm_dir)
        policy.init_eval()
        try:
            assert policy.wait_for_weight_update_done(timeout=0)  # nothing requested yet
            version = publisher.send(trainer.get_trainable_parameters())
            policy._rollout_gate.idle.acquire()  # a long rollout step holds the gate
            policy.notify_update_weights()
            assert not policy.wait_for_weight_update_done(timeout=0.3)
            assert policy.weight_version == -1
            policy._rollout_gate.idle.release()  # the step ends
            assert policy.wait_for_weight_update_done(timeout=10)
            assert policy.weight_version == version
            fingerprint = policy.get_param_fingerprint()
            assert fingerprint == pytest.approx(trainer.get_param_fingerprint(), rel=1e-6)
        finally:
            policy.close()


def test_strategy_none_has_no_updater_and_never_waits() -> None:
    policy = tiny_policy("eval", strategy="None")
    policy.init_eval()
    policy.notify_update_weights()
    assert policy.wait_for_weight_update_done(timeout=0)
    assert policy._weight_updater is None


def test_view_mode_parameters_are_views_of_the_slot_and_keep_it_pinned(shm_dir: Path) -> None:
    trainer = tiny_policy("train")
    trainer.init_train()
    with WeightPublisher(PublisherConfig(shm_dir=shm_dir, slot_wait_timeout=0.3)) as publisher:
        policy, source = make_eval(GatedTiny, shm_dir, mode="view")
        policy.init_eval()
        try:
            publisher.send(trainer.get_trainable_parameters())
            policy.update_weights_from_buffer()
            slot = source._held
            weight = policy.actor[0].weight
            start = slot.buffer.data_ptr()
            assert start <= weight.data_ptr() < start + slot.buffer.numel()
            version_1 = weight.detach().clone()
            publisher.send(trainer.get_trainable_parameters())  # the other slot is free
            trainer.train()
            # Ours is pinned by the model past the timeout: the writer reclaims the slot with new
            # files (no SlotBusyError), and the model's views keep version 1's bytes, unchanged.
            publisher.send(trainer.get_trainable_parameters())
            assert publisher.writer.reclaimed == 1
            assert start <= policy.actor[0].weight.data_ptr() < start + slot.buffer.numel()
            assert torch.equal(policy.actor[0].weight, version_1)
            policy.update_weights_from_buffer()  # moves to version 3 and lets version 1's old file go
            assert policy.weight_version == 3
            assert torch.equal(policy.actor[0].weight, trainer.actor[0].weight)
            publisher.send(trainer.get_trainable_parameters())
            assert publisher.writer.reclaimed == 1  # nobody pins what the writer needs now
        finally:
            policy.close()


def test_copy_mode_uses_shadow_buffers_and_releases_the_slot_at_once(shm_dir: Path) -> None:
    trainer = tiny_policy("train")
    trainer.init_train()
    with WeightPublisher(PublisherConfig(shm_dir=shm_dir, slot_wait_timeout=0.3)) as publisher:
        policy, source = make_eval(GatedTiny, shm_dir, mode="copy")
        policy.init_eval()
        try:
            for _ in range(4):
                trainer.train()
                publisher.send(trainer.get_trainable_parameters())
                publisher.send(trainer.get_trainable_parameters())  # never blocked: no pin is kept
                assert policy.update_weights_from_buffer() == publisher.version
                for name, value in trainer.actor.state_dict().items():
                    assert torch.equal(policy.actor.state_dict()[name], value)
            shadows = {flat.data_ptr() for flat in source._shadows.flats}
            start = source._shadows.flats[source._shadows.in_use].data_ptr()
            assert policy.actor[0].weight.data_ptr() - start < source._shadows.layout.total_bytes
            assert len(shadows) == 2
        finally:
            policy.close()


class CopyingTiny(GatedTiny):
    loads = 0

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False, *args, **kwargs) -> None:
        self.loads += 1
        for name, model in self.model_list:
            model.load_state_dict(state_dict[name])


def test_a_policy_with_its_own_load_state_dict_gets_it_called_and_keeps_no_pin(shm_dir: Path) -> None:
    trainer = tiny_policy("train")
    trainer.init_train()
    with WeightPublisher(PublisherConfig(shm_dir=shm_dir, slot_wait_timeout=0.3)) as publisher:
        policy, source = make_eval(CopyingTiny, shm_dir)
        policy.init_eval()
        try:
            for _ in range(3):
                trainer.train()
                publisher.send(trainer.get_trainable_parameters())
                publisher.send(trainer.get_trainable_parameters())
                policy.update_weights_from_buffer()
            assert policy.loads == 3
            assert source._held is None
            assert policy.get_param_fingerprint() == pytest.approx(trainer.get_param_fingerprint(), rel=1e-6)
        finally:
            policy.close()
