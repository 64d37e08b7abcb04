"""``rlkube bench fragment-bytes JOB``: the measured size of one trajectory fragment on the wire.

One eval worker's fragment of the job (its env, wrappers, ``numEnvs`` and ``fragmentLength``,
the job's own policy) is collected by the real rollout worker and serialised by the real
trajectory plane (``coordinator.wire.fragment_to_proto``): the figure is the protobuf message's
``ByteSize()``, what ``PushTrajectory`` carries. It is then serialised again with every uint8
leaf cast to float32 -- what the fragment would weigh if pixels were kept as floats -- so the
saving of uint8 observations is a measurement, not arithmetic. Per-leaf bytes are printed too.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import torch
from rlkube.coordinator.wire import fragment_to_proto
from rlkube.data.fragment import Fragment
from rlkube.engine.rollout import RolloutWorker
from rlkube.envs.group import EnvGroup
from rlkube.jobfile import load_job
from rlkube.policy import POLICIES, PolicyRole, import_modules
from tensordict import TensorDict


def as_float32(data: TensorDict) -> TensorDict:
    """``data`` with every uint8 leaf cast to float32 (other leaves unchanged)."""
    return data.apply(lambda t: t.to(torch.float32) if t.dtype == torch.uint8 else t)


def message_bytes(fragment: Fragment) -> int:
    # Weight version 1: the worker acts with no trained weights here (the policy's own init).
    stamped = dataclasses.replace(fragment, weight_version=1)
    return fragment_to_proto(stamped, task_id="bench", worker_id="bench", epoch=0).ByteSize()


def leaf_bytes(data: TensorDict) -> dict[str, tuple[str, int]]:
    leaves = data.items(include_nested=True, leaves_only=True)
    return {
        ".".join(key) if isinstance(key, tuple) else key: (
            str(t.dtype).removeprefix("torch."),
            t.numel() * t.element_size(),
        )
        for key, t in leaves
    }


def measure(job_path: Path) -> dict[str, Any]:
    job = load_job(job_path)
    spec = job.spec
    import_modules(spec.env.imports)
    policy = POLICIES.get(spec.policy.type)(spec.policy, PolicyRole.EVAL)
    with EnvGroup.from_spec(spec.env, base_seed=spec.train.seed) as group:
        group.reset()
        policy.init_eval(None, env_meta=group.meta)
        fragment = RolloutWorker(group, policy).collect(spec.train.fragment_length)
    policy.close()
    as_floats = Fragment(
        data=as_float32(fragment.data),
        episode_returns=fragment.episode_returns,
        episode_lengths=fragment.episode_lengths,
        weight_version=fragment.weight_version,
    )
    return {
        "job": job.name,
        "env": spec.env.id,
        "num_envs": fragment.num_envs,
        "fragment_length": fragment.length,
        "env_steps": fragment.env_steps,
        "message_bytes": message_bytes(fragment),
        "message_bytes_float32": message_bytes(as_floats),
        "leaves": leaf_bytes(fragment.data),
    }


def report(row: dict[str, Any]) -> str:
    uint8, floats, steps = row["message_bytes"], row["message_bytes_float32"], row["env_steps"]
    shape = f"{row['num_envs']} envs x {row['fragment_length']} steps"
    lines = [
        f"{row['job']} ({row['env']}): one fragment of {shape} = {steps:,} env steps",
        f"  PushTrajectory message as sent:         {uint8 / 1e6:10.2f} MB ({uint8 / steps:,.0f} B/step)",
        f"  the same with uint8 leaves as float32:  {floats / 1e6:10.2f} MB ({floats / steps:,.0f} B/step)",
        f"  ratio float32 / as sent:                {floats / uint8:10.2f}x",
        "  leaves:",
    ]
    for key, (dtype, nbytes) in sorted(row["leaves"].items(), key=lambda item: -item[1][1]):
        lines.append(f"    {key:32s} {dtype:>8s} {nbytes / 1e6:10.3f} MB")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rlkube bench fragment-bytes", description=__doc__)
    parser.add_argument("job", nargs="?", default="examples/breakout.yaml", help="a job file")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = parser.parse_args(argv)
    row = measure(args.job)
    print(report(row))
    if args.json:
        args.json.write_text(json.dumps(row, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
