"""The RLJob's ``env`` section and its ``wrappers`` (gymnasium wrappers, applied in order).

Pure: no I/O.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    Field,
    StringConstraints,
    WithJsonSchema,
    model_validator,
)

from rlkube.config import Config
from rlkube.spec.base import PositiveInt, _Model

# ---------------------------------------------------------------------------- env wrappers
# ``spec.env.wrappers`` is an ordered list; the first entry wraps the raw env, each next one wraps
# the previous. Episode statistics are recorded *inside* all of them (the raw game's returns), so a
# reward wrapper or an episodic-life wrapper never changes what the user is shown.


class ClipActionWrapper(_Model):
    """Clip Box actions to the action space's bounds (gymnasium ``ClipAction``)."""

    type: Literal["ClipAction"]


class RescaleActionWrapper(_Model):
    """Let the policy act in ``[minAction, maxAction]``, rescaled to the env's bounds (``RescaleAction``)."""

    type: Literal["RescaleAction"]
    min_action: float = Field(-1.0, description="Lower bound the policy acts in.")
    max_action: float = Field(1.0, description="Upper bound the policy acts in.")

    @model_validator(mode="after")
    def _ordered(self) -> RescaleActionWrapper:
        if self.min_action >= self.max_action:
            raise ValueError(f"minAction ({self.min_action}) must be below maxAction ({self.max_action})")
        return self


class NormalizeRewardWrapper(_Model):
    """Scale rewards by the running std of the discounted return (gymnasium ``NormalizeReward``).

    Per env: the statistics only shape the training signal, never the returns reported.
    """

    type: Literal["NormalizeReward"]
    gamma: float = Field(0.99, ge=0.0, le=1.0, description="Discount of the return whose std scales.")
    epsilon: float = Field(1e-8, gt=0.0, description="Added to the variance.")
    clip: float | None = Field(10.0, gt=0.0, description="Clip the scaled reward to +-clip (null: off).")


class ScaleRewardWrapper(_Model):
    """Multiply every reward by ``scale``."""

    type: Literal["ScaleReward"]
    scale: float = Field(..., gt=0.0, description="Factor applied to each reward.")


class ClipRewardWrapper(_Model):
    """Clip rewards to ``[min, max]``; ``sign: true`` maps them to -1, 0, 1 (Atari)."""

    type: Literal["ClipReward"]
    min: float = Field(-1.0, description="Lower bound.")
    max: float = Field(1.0, description="Upper bound.")
    sign: bool = Field(False, description="Use sign(reward) instead of clipping.")

    @model_validator(mode="after")
    def _ordered(self) -> ClipRewardWrapper:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) must not exceed max ({self.max})")
        return self


class FrameStackWrapper(_Model):
    """Stack the last ``stackSize`` observations on a new leading axis (``FrameStackObservation``)."""

    type: Literal["FrameStack"]
    stack_size: int = Field(4, ge=1, le=64, description="Observations stacked.")


class AtariPreprocessingWrapper(_Model):
    """gymnasium ``AtariPreprocessing`` (noop reset, frame skip with max-pool, resize, grey).

    Make the env with ``kwargs: {frameskip: 1}`` (ALE v5 skips 4 frames itself) and
    ``repeatActionProbability`` as wanted; this wrapper does the skipping.
    """

    type: Literal["AtariPreprocessing"]
    noop_max: int = Field(30, ge=0, description="Up to this many no-ops after reset.")
    frame_skip: int = Field(4, ge=1, description="Frames per action; the last two are max-pooled.")
    screen_size: int = Field(84, ge=8, le=1024, description="Square side of the resized frame.")
    grayscale_obs: bool = Field(True, description="One grey channel instead of RGB.")
    terminal_on_life_loss: bool = Field(False, description="End the episode at a life loss.")


class EpisodicLifeWrapper(_Model):
    """Signal ``terminated`` at every life loss, reset the game only when it is over (Atari)."""

    type: Literal["EpisodicLife"]


class FireResetWrapper(_Model):
    """Press FIRE after each reset, for games that wait for it (Breakout)."""

    type: Literal["FireReset"]


class TimeLimitWrapper(_Model):
    """Truncate episodes after ``maxEpisodeSteps`` steps (``TimeLimit``)."""

    type: Literal["TimeLimit"]
    max_episode_steps: int = Field(..., ge=1, description="Steps before the episode is truncated.")


class NormalizeObservationWrapper(_Model):
    """Refused with a pointer: observation statistics are model state, not per-env state."""

    type: Literal["NormalizeObservation"]

    @model_validator(mode="after")
    def _refuse(self) -> NormalizeObservationWrapper:
        raise ValueError(
            "no NormalizeObservation wrapper (per-env statistics would differ between eval workers "
            "and the trainer); set spec.policy.modelCfg.normalizeObservation: true, whose statistics "
            "travel with the weights"
        )


class CustomWrapper(_Model):  # type: ignore[no-redef]  # mypy's pydantic plugin: a field named kwargs
    """A wrapper a module in ``spec.env.imports`` registered with ``@WRAPPERS.register(name)``."""

    type: Literal["Custom"]
    name: Annotated[str, StringConstraints(min_length=1)] = Field(..., description="Registered name.")
    kwargs: Config = Field(default_factory=Config, description="Keyword arguments of the wrapper.")


WRAPPER_TYPES = (
    "ClipAction",
    "RescaleAction",
    "NormalizeReward",
    "ScaleReward",
    "ClipReward",
    "FrameStack",
    "AtariPreprocessing",
    "EpisodicLife",
    "FireReset",
    "TimeLimit",
    "NormalizeObservation",
    "Custom",
)

WrapperSpec = Annotated[
    ClipActionWrapper
    | RescaleActionWrapper
    | NormalizeRewardWrapper
    | ScaleRewardWrapper
    | ClipRewardWrapper
    | FrameStackWrapper
    | AtariPreprocessingWrapper
    | EpisodicLifeWrapper
    | FireResetWrapper
    | TimeLimitWrapper
    | NormalizeObservationWrapper
    | CustomWrapper,
    Field(discriminator="type"),
    # The CRD cannot carry a discriminated union (structural schemas have no oneOf of objects):
    # it checks the type name at apply time; the settings are checked by this model everywhere.
    WithJsonSchema(
        {
            "type": "object",
            "required": ["type"],
            "properties": {"type": {"type": "string", "enum": list(WRAPPER_TYPES)}},
            "additionalProperties": True,
            "description": "One env wrapper: type and its settings (see docs/rljob-reference.md).",
        }
    ),
]


class EnvSpec(_Model):  # type: ignore[no-redef]  # mypy's pydantic plugin: a field named kwargs
    """``env``: the gymnasium environment each eval replica runs as a vector of ``numEnvs`` copies."""

    id: Annotated[str, StringConstraints(min_length=1)] = Field(
        ..., description="gymnasium id, e.g. CartPole-v1."
    )
    num_envs: PositiveInt = Field(8, le=4096, description="Environments per eval replica.")
    kwargs: Config = Field(default_factory=Config, description="Keyword arguments for gymnasium.make.")
    vectorization: Literal["sync", "async", "envpool"] = Field(
        "sync",
        description="How the envs are stepped: gymnasium's 'sync' (in-process) or 'async' (in "
        "subprocesses), or 'envpool' (C++ threads; the id must be one envpool has, and each wrapper "
        "maps to an envpool option or the job is refused).",
    )
    imports: list[str] = Field(
        default_factory=list,
        description="Modules imported before gymnasium.make (registering envs and @register_wrapper ones).",
    )
    wrappers: list[WrapperSpec] = Field(
        default_factory=list,
        description="Wrappers applied in order around each env (the first wraps the raw env); "
        "episode returns are always reported raw, from inside all of them.",
    )
    allow_non_finite: bool = Field(
        False,
        description="Accept NaN and Inf in observations and rewards (an env that uses them as markers "
        "and a policy that handles them); otherwise the coordinator refuses such fragments. "
        "Log-probabilities and values must be finite either way.",
    )
