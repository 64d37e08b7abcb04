"""RLightning's ``rlightning.utils.utils``: ``to_device``. Pure (no I/O)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase


def to_device(data: Any, device: str | torch.device) -> Any:
    """``data`` with every tensor, TensorDict and numpy array (as a tensor) on ``device``.

    Dicts, lists and tuples are rebuilt with their items moved; anything else is returned as is.
    A ``uint16`` array is read as the bfloat16 bits it carries, as RLightning does.
    """
    if isinstance(data, torch.Tensor | TensorDictBase):
        return data.to(device)
    if isinstance(data, np.ndarray):
        tensor = torch.from_numpy(data)
        return (tensor.view(torch.bfloat16) if data.dtype == np.uint16 else tensor).to(device)
    if isinstance(data, Mapping):
        return type(data)({key: to_device(value, device) for key, value in data.items()})  # type: ignore[call-arg]
    if isinstance(data, list | tuple):
        return type(data)(to_device(item, device) for item in data)
    return data
