"""State dicts for the benchmark: shaped like real models, at a target size.

``transformer``: bf16 matrices (embedding, qkv, projection, MLP up/down) with fp32 norms and
an fp32 value head, as a mixed-precision policy would hold them. ``mlp``: fp32 linear layers.
Eval models are built with uninitialised storage (``torch.empty``): memory is only touched by
methods that copy into it.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch
from rlkube.envs.types import EnvRet, PolicyResponse
from rlkube.policy.base import BasePolicy
from torch import nn

# {module: {param: (shape, dtype name)}}
Spec = dict[str, dict[str, tuple[tuple[int, ...], str]]]


def transformer_spec(size: int) -> Spec:
    if size < 5e6:
        d, vocab = 128, 2000
    elif size < 50e6:
        d, vocab = 256, 8000
    elif size < 500e6:
        d, vocab = 768, 32000
    else:
        d, vocab = 1024, 32000
    per_layer = 12 * d * d * 2 + 2 * d * 4
    embed = vocab * d * 2
    layers = max(1, round((size - embed) / per_layer))
    body: dict[str, tuple[tuple[int, ...], str]] = {"embed.weight": ((vocab, d), "bfloat16")}
    for i in range(layers):
        p = f"layers.{i}"
        body[f"{p}.norm1.weight"] = ((d,), "float32")
        body[f"{p}.attn.qkv.weight"] = ((3 * d, d), "bfloat16")
        body[f"{p}.attn.proj.weight"] = ((d, d), "bfloat16")
        body[f"{p}.norm2.weight"] = ((d,), "float32")
        body[f"{p}.mlp.up.weight"] = ((4 * d, d), "bfloat16")
        body[f"{p}.mlp.down.weight"] = ((d, 4 * d), "bfloat16")
    body["norm.weight"] = ((d,), "float32")
    head = {
        "0.weight": ((256, d), "float32"),
        "0.bias": ((256,), "float32"),
        "2.weight": ((1, 256), "float32"),
    }
    return {"model": body, "value_head": head}


def mlp_spec(size: int) -> Spec:
    layers = 8
    d = max(8, int(math.sqrt(size / (4 * layers))))
    body: dict[str, tuple[tuple[int, ...], str]] = {}
    for i in range(layers):
        body[f"layers.{i}.weight"] = ((d, d), "float32")
        body[f"layers.{i}.bias"] = ((d,), "float32")
    return {"actor": body, "critic": {"weight": ((1, d), "float32"), "bias": ((1,), "float32")}}


SPECS = {"transformer": transformer_spec, "mlp": mlp_spec}


def spec_bytes(spec: Spec) -> int:
    return sum(
        math.prod(shape) * getattr(torch, dtype).itemsize
        for params in spec.values()
        for shape, dtype in params.values()
    )


def build_module(params: dict[str, tuple[tuple[int, ...], str]]) -> nn.Module:
    """A module tree with these (dotted) parameter names, storage left uninitialised."""
    root = nn.Module()
    for name, (shape, dtype) in params.items():
        owner = root
        *path, leaf = name.split(".")
        for part in path:
            if not hasattr(owner, part):
                owner.add_module(part, nn.Module())
            owner = getattr(owner, part)
        owner.register_parameter(
            leaf, nn.Parameter(torch.empty(shape, dtype=getattr(torch, dtype)), requires_grad=False)
        )
    return root


def make_state_dict(spec: Spec, *, seed: int = 0) -> dict[str, dict[str, torch.Tensor]]:
    """The trainer's weights (random, deterministic)."""
    gen = torch.Generator().manual_seed(seed)
    return {
        module: {
            name: torch.randn(shape, generator=gen, dtype=torch.float32).to(getattr(torch, dtype))
            for name, (shape, dtype) in params.items()
        }
        for module, params in spec.items()
    }


def advance_(state_dict: dict[str, dict[str, torch.Tensor]]) -> None:
    """A new version: every tensor changes."""
    with torch.no_grad():
        for params in state_dict.values():
            for tensor in params.values():
                tensor.add_(1)


def fingerprint(state_dict: dict[str, dict[str, torch.Tensor]]) -> dict[str, float]:
    return {
        f"{module}.{name}": float(t.detach().float().norm().item())
        for module, params in state_dict.items()
        for name, t in params.items()
    }


class BenchPolicy(BasePolicy):
    """An eval policy over a Spec; a rollout step reads a weight and sleeps 1 ms (inference)."""

    def construct_network(self, env_meta: Any = None, *args: Any, **kwargs: Any) -> None:
        spec: Spec = self.config.model_cfg["spec"]
        self.model_list = []
        for module, params in spec.items():
            setattr(self, module, build_module({k: (tuple(s), d) for k, (s, d) in params.items()}))
            self.model_list.append((module, getattr(self, module)))

    def setup_optimizer(self, optim_cfg: Any) -> None:
        return None

    def rollout_step(self, env_ret: EnvRet, **kwargs: Any) -> PolicyResponse:
        first = next(iter(self.model_list[0][1].parameters()))
        value = first.reshape(-1)[0].float()
        time.sleep(0.001)
        return PolicyResponse(env_id=env_ret.env_id, value=value.expand(env_ret.env_id.shape[0]))

    def postprocess(self, env_ret: Any = None, policy_resp: Any = None) -> None:
        return None

    def update_dataset(self, data: Any) -> None:
        return None

    def train(self, *args: Any, **kwargs: Any) -> None:
        return None
