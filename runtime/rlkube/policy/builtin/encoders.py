"""Image handling for the built-in PPO: layout to CHW and the Nature-DQN CNN (Mnih et al. 2015).

Pure (no I/O). Observations stay as the env produced them on the wire and in fragments (uint8
frames stay uint8, 4x fewer bytes than float32); :func:`to_chw` and the division by 255 happen
inside the network, on the batch being evaluated.
"""

from __future__ import annotations

import math
from typing import Literal, cast

import torch
from torch import nn

ImageLayout = Literal["auto", "hwc", "chw"]


def image_layout(shape: tuple[int, ...], layout: ImageLayout) -> Literal["hwc", "chw"]:
    """Resolve ``auto``: a trailing axis of 1, 3 or 4 with a larger leading one is HWC, else CHW."""
    if layout != "auto":
        return layout
    if len(shape) >= 3 and shape[-1] in (1, 3, 4) and shape[-3] > 4:
        return "hwc"
    return "chw"


def chw_shape(shape: tuple[int, ...], layout: Literal["hwc", "chw"]) -> tuple[int, int, int]:
    """``(C, H, W)`` the CNN sees: 2-D frames get one channel, stacked frames merge into channels."""
    if len(shape) == 2:
        return (1, shape[0], shape[1])
    if len(shape) < 2 or len(shape) > 4:
        raise ValueError(f"an image observation has 2 to 4 axes, got shape {shape}")
    if layout == "hwc":
        *lead, h, w, c = shape
        return (c * math.prod(lead), h, w)
    *lead, h, w = shape
    return (math.prod(lead), h, w)


def to_chw(obs: torch.Tensor, sample_shape: tuple[int, ...], layout: Literal["hwc", "chw"]) -> torch.Tensor:
    """``[B, *sample_shape]`` -> ``[B, C, H, W]`` float (uint8 scaled to [0, 1])."""
    batch = obs.shape[0]
    x = obs.float() / 255.0 if obs.dtype == torch.uint8 else obs.float()
    if len(sample_shape) == 2:
        return x.reshape(batch, 1, *sample_shape)
    if layout == "hwc":
        lead = len(sample_shape) - 3
        # [B, *lead, H, W, C] -> [B, *lead, C, H, W]
        x = x.movedim(-1, 1 + lead)
    c, h, w = chw_shape(sample_shape, layout)
    return x.reshape(batch, c, h, w)


def _conv(c_in: int, c_out: int, kernel: int, stride: int) -> nn.Conv2d:
    layer = nn.Conv2d(c_in, c_out, kernel, stride)
    nn.init.orthogonal_(layer.weight, math.sqrt(2))
    nn.init.zeros_(cast(torch.Tensor, layer.bias))
    return layer


class NatureCNN(nn.Module):
    """Three convolutions and a 512-unit layer (CleanRL's ``ppo_atari.py`` trunk), orthogonal init."""

    def __init__(
        self, sample_shape: tuple[int, ...], layout: ImageLayout = "auto", features: int = 512
    ) -> None:
        super().__init__()
        self.sample_shape = tuple(sample_shape)
        self.layout = image_layout(self.sample_shape, layout)
        c, h, w = chw_shape(self.sample_shape, self.layout)
        self.convs = nn.Sequential(
            _conv(c, 32, 8, 4), nn.ReLU(), _conv(32, 64, 4, 2), nn.ReLU(), _conv(64, 64, 3, 1), nn.ReLU()
        )
        with torch.no_grad():
            flat = int(self.convs(torch.zeros(1, c, h, w)).numel())
        self.fc = nn.Linear(flat, features)
        nn.init.orthogonal_(self.fc.weight, math.sqrt(2))
        nn.init.constant_(self.fc.bias, 0.0)
        self.features = features

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = to_chw(obs, self.sample_shape, self.layout)
        return torch.relu(self.fc(self.convs(x).flatten(1)))
