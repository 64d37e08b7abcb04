"""The peer: RLightning's synchronous loop on Ray, with rlkube's own policy and envs.

RLightning's ``SyncRLEngine`` runs eval workers as Ray actors; every epoch the trainer puts its
weights in the object store, each actor gets them and loads them into its EVAL policy, collects
its share of the epoch, and returns the fragments through the object store (pickled). This
module does exactly that with the same ``PPO``, ``EnvGroup`` and ``RolloutWorker`` the rlkube
rows use, so the rows differ only in how work, trajectories and weights move.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from rlkube.data.rollout_buffer import RolloutBuffer
from rlkube.engine.rollout import RolloutWorker
from rlkube.envs.group import EnvGroup
from rlkube.launch.in_process import with_strategy_none
from rlkube.policy import POLICIES, PolicyRole, import_modules
from rlkube.policy.base import seed_everything
from rlkube.spec import RLJob, parse_job


class RolloutActor:
    """One eval worker: an EnvGroup and an EVAL policy that loads the weights it is handed."""

    def __init__(self, job: dict[str, Any], replica: int) -> None:
        torch.set_num_threads(1)  # as the rlkube pods run (OMP_NUM_THREADS=1)
        spec = parse_job(job).spec
        import_modules(spec.imports)  # e.g. the per-env policy of the bench
        self.policy = POLICIES.get(spec.policy.type)(with_strategy_none(spec.policy), PolicyRole.EVAL)
        self.group = EnvGroup.from_spec(spec.env, base_seed=spec.train.seed, replica_index=replica)
        self.group.reset()
        self.policy.init_eval(None, env_meta=self.group.meta)
        self.worker = RolloutWorker(self.group, self.policy, replica=replica)
        self.fragment_length = spec.train.fragment_length

    def collect(
        self, weights: dict[str, Any], version: int, fragments: int
    ) -> tuple[list[Any], float, float]:
        """Load ``weights`` (the object store resolved the reference), then collect ``fragments``.

        Returns the fragments, the seconds spent loading and the seconds spent rolling out.
        """
        started = time.perf_counter()
        self.policy.load_state_dict(weights)
        self.policy.weight_version = version
        loaded = time.perf_counter()
        out = [self.worker.collect(self.fragment_length) for _ in range(fragments)]
        return out, loaded - started, time.perf_counter() - loaded

    def close(self) -> None:
        self.group.close()
        self.policy.close()


def shares(total: int, workers: int) -> list[int]:
    """``total`` fragments dealt over ``workers`` as evenly as possible (RLightning splits the epoch)."""
    base, extra = divmod(total, workers)
    return [base + (1 if i < extra else 0) for i in range(workers)]


def measure_ray_sync(job: RLJob, raw: dict[str, Any], *, workers: int) -> dict[str, Any]:
    """Train ``job`` with Ray actors as eval workers: env steps/s and the weight-load share."""
    import ray

    torch.set_num_threads(1)
    spec = job.spec
    seed_everything(spec.train.seed)
    actor_cls = ray.remote(num_cpus=0)(RolloutActor)
    actors = [actor_cls.remote(raw, replica) for replica in range(workers)]
    meta_group = EnvGroup.from_spec(spec.env, base_seed=spec.train.seed)
    meta_group.reset()
    policy = POLICIES.get(spec.policy.type)(with_strategy_none(spec.policy), PolicyRole.TRAIN)
    policy.init_train(spec.train, env_meta=meta_group.meta)
    meta_group.close()
    per_epoch = spec.fragments_per_epoch()
    buffer = RolloutBuffer(fragments_per_epoch=per_epoch, capacity=per_epoch)
    env_steps = 0
    load_seconds = rollout_seconds = 0.0
    ray.get([a.__ray_ready__.remote() for a in actors])  # start-up is not measured (nor is rlkube's)
    started = time.perf_counter()
    for epoch in range(spec.train.max_epochs):
        weights = ray.put(policy.get_trainable_parameters())  # pickled into the object store: a copy
        calls = [
            actor.collect.remote(weights, epoch, count)
            for actor, count in zip(actors, shares(per_epoch, workers), strict=True)
            if count
        ]
        index = 0
        for fragments, loading, rolling in ray.get(calls):
            load_seconds += loading
            rollout_seconds += rolling
            for fragment in fragments:
                buffer.add(f"e{epoch}-f{index}", fragment)
                index += 1
        batch = buffer.take_epoch()
        env_steps += batch.env_steps
        policy.update_dataset(batch.shard(0, 1))
        policy.train()
    seconds = time.perf_counter() - started
    ray.get([a.close.remote() for a in actors])
    for actor in actors:
        ray.kill(actor)
    policy.close()
    busy = load_seconds + rollout_seconds
    return {
        "method": "ray",
        "engine": "sync",
        "workers": workers,
        "env_steps": env_steps,
        "seconds": seconds,
        "weight_wait_fraction": round(load_seconds / busy, 4) if busy else 0.0,
    }
