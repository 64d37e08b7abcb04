"""The built-in SAC's settings: ``spec.policy.modelCfg``, ``optimCfg`` and ``algoCfg``.

Pure: validation only (see ``ppo_config.parse_section`` for the error format). Defaults are
stable-baselines3's ``SAC`` (automatic temperature, target entropy ``-dim(A)``), except
``updatesPerStep``, which states the update-to-data ratio SB3 expresses as ``gradient_steps``
per ``train_freq``.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel


class _Section(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, validate_by_name=True, validate_by_alias=True, extra="forbid", frozen=True
    )


class SACAlgoConfig(_Section):
    """``spec.policy.algoCfg``."""

    gamma: float = Field(0.99, ge=0.0, le=1.0, description="Discount factor.")
    tau: float = Field(0.005, gt=0.0, le=1.0, description="Polyak rate of the target critics.")
    updates_per_step: float = Field(
        1.0,
        gt=0.0,
        description="Gradient steps per collected env step: each epoch takes "
        "round(updatesPerStep * stepsPerEpoch) steps, each on train.batchSize transitions.",
    )
    init_alpha: float = Field(1.0, gt=0.0, description="Initial temperature.")
    learn_alpha: bool = Field(True, description="Learn the temperature towards targetEntropy.")
    target_entropy: float | None = Field(None, description="Entropy target (null: -dim(action space)).")


class SACOptimConfig(_Section):
    """``spec.policy.optimCfg`` (Adam for actor, critics and temperature)."""

    lr: float = Field(3e-4, gt=0.0, description="Adam learning rate of actor, critics and temperature.")


Activation = Literal["relu", "tanh", "elu", "gelu", "silu"]


class SACModelConfig(_Section):
    """``spec.policy.modelCfg``: MLP actor and twin MLP critics."""

    hidden_sizes: list[Annotated[int, Field(ge=1)]] = Field(
        default_factory=lambda: [256, 256], description="Hidden layer widths of actor and critics."
    )
    activation: Activation = Field("relu")
