"""``NatureCNN`` with RLightning's constructor, on rlkube's Nature-DQN trunk. Pure (no I/O).

What RLightning's policies rely on, kept: ``NatureCNN(standard_input_size=(84, 84), in_channels=3,
image_format="CHW" | "HWC")``, a 256-wide feature vector named by ``out_feature_dim``, and a
``forward`` that takes a ``[B, H, W, C]`` (HWC) or ``[B, C, H, W]`` (CHW) batch as a tensor or a
numpy array, moves it to the network's device, scales pixel values above 1 into [0, 1], resizes
each frame to ``standard_input_size`` (bicubic) and normalises the three colour channels with the
ImageNet statistics. Any other batch rank is an error naming the format and the shape.

The convolutions and the feature layer are :class:`rlkube.policy.builtin.encoders.NatureCNN`,
the built-in PPO's own trunk; this class only adds the input handling above.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from rlkube.policy.builtin import encoders

#: The per-channel statistics RLightning normalises RGB frames with (ImageNet's).
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
#: Width of the feature vector (``out_feature_dim``), as in RLightning.
FEATURES = 256


class NatureCNN(nn.Module):
    """Image batch -> ``[B, out_feature_dim]`` features; see the module docstring."""

    def __init__(
        self,
        standard_input_size: tuple[int, int] = (84, 84),
        in_channels: int = 3,
        image_format: Literal["CHW", "HWC"] = "CHW",
    ) -> None:
        super().__init__()
        if image_format not in ("CHW", "HWC"):
            raise ValueError(f"NatureCNN image_format must be 'CHW' or 'HWC', got {image_format!r}")
        self.image_format = image_format
        self.in_channels = in_channels
        self.standard_input_size = tuple(standard_input_size)
        self.out_feature_dim = FEATURES
        self.trunk = encoders.NatureCNN(
            (in_channels, *self.standard_input_size), layout="chw", features=FEATURES
        )
        # Constants, not buffers: DDP would broadcast buffers before every forward.
        self._normalise = in_channels == len(IMAGENET_MEAN)
        self._statistics: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def forward(self, obs: torch.Tensor | np.ndarray) -> torch.Tensor:
        if isinstance(obs, np.ndarray):
            obs = torch.from_numpy(obs)
        if obs.dim() != 4:
            raise ValueError(
                f"NatureCNN(image_format={self.image_format!r}) takes a batch of images "
                f"[B, {'H, W, C' if self.image_format == 'HWC' else 'C, H, W'}], got shape {tuple(obs.shape)}"
            )
        device = next(self.trunk.parameters()).device
        x = obs.to(device, torch.float32)
        if self.image_format == "HWC":
            x = x.permute(0, 3, 1, 2)
        if x.max() > 1.0:
            x = x / 255.0
        if tuple(x.shape[-2:]) != self.standard_input_size:
            x = F.interpolate(x, size=self.standard_input_size, mode="bicubic", align_corners=False)
        if self._normalise:
            mean, std = self._colour_statistics(device)
            x = (x - mean) / std
        return self.trunk(x)

    def _colour_statistics(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """ImageNet's per-channel mean and std as ``[1, 3, 1, 1]`` tensors on ``device`` (made once)."""
        if device not in self._statistics:
            self._statistics[device] = (
                torch.tensor(IMAGENET_MEAN, device=device).view(1, -1, 1, 1),
                torch.tensor(IMAGENET_STD, device=device).view(1, -1, 1, 1),
            )
        return self._statistics[device]
