"""RLightning's toy ``NatureCNN(sample_obs)``: features of a dict observation. Pure (no I/O).

``sample_obs["rgb"]`` is a ``[B, H, W, C]`` batch (uint8 pixels are scaled to [0, 1]); an optional
``sample_obs["state"]`` ``[B, D]`` gets a 256-wide linear layer. ``forward(obs)`` concatenates
the features of the keys present at construction; ``out_features`` is their width (256 or 512).
The image trunk is the built-in PPO's Nature-DQN CNN.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from rlkube.policy.builtin import encoders

FEATURES = 256


class NatureCNN(nn.Module):
    """``{"rgb": [B, H, W, C], "state"?: [B, D]}`` -> ``[B, out_features]``."""

    def __init__(self, sample_obs: Mapping[str, torch.Tensor]) -> None:
        super().__init__()
        if "rgb" not in sample_obs:
            raise KeyError(f"toy NatureCNN needs an 'rgb' observation, got keys {sorted(sample_obs)}")
        rgb_shape = tuple(sample_obs["rgb"].shape[1:])
        extractors: dict[str, nn.Module] = {
            "rgb": encoders.NatureCNN(rgb_shape, layout="hwc", features=FEATURES)
        }
        if "state" in sample_obs:
            extractors["state"] = nn.Linear(int(sample_obs["state"].shape[-1]), FEATURES)
        self.extractors = nn.ModuleDict(extractors)
        self.out_features = FEATURES * len(extractors)

    def forward(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return torch.cat([extractor(obs[key]) for key, extractor in self.extractors.items()], dim=1)
