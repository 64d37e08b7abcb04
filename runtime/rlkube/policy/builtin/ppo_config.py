"""The built-in PPO's settings: ``spec.policy.modelCfg``, ``optimCfg`` and ``algoCfg``.

Pure: validation only. Keys use the YAML spelling (``gaeLambda``; the Python names are accepted
too); an unknown key or a bad value is a :class:`~rlkube.spec.SpecError` naming
``spec.policy.<section>.<key>``, raised when the policy is constructed, before any env starts.
Defaults are CleanRL's ``ppo.py`` (classic control) unless noted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from rlkube.spec import SpecError


class _Section(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, validate_by_name=True, validate_by_alias=True, extra="forbid", frozen=True
    )


class PPOAlgoConfig(_Section):
    """``spec.policy.algoCfg``."""

    gamma: float = Field(0.99, ge=0.0, le=1.0, description="Discount factor.")
    gae_lambda: float = Field(0.95, ge=0.0, le=1.0, description="GAE lambda (bias/variance trade-off).")
    clip_coef: float = Field(0.2, gt=0.0, description="Surrogate clipping epsilon (also clips the value).")
    vf_coef: float = Field(0.5, ge=0.0, description="Weight of the value loss.")
    ent_coef: float = Field(0.0, ge=0.0, description="Weight of the entropy bonus.")
    update_epochs: int = Field(4, ge=1, description="Passes over the epoch's data per train().")
    norm_adv: bool = Field(True, description="Normalise advantages per minibatch.")
    clip_vloss: bool = Field(True, description="Clip the value loss around the old values.")
    clip_vloss_form: Literal["max", "clipped"] = Field(
        "max",
        description="With clipVloss: max trains on the larger of the clipped and unclipped losses "
        "(CleanRL, OpenAI baselines); clipped trains on the clipped value's loss alone "
        "(Stable-Baselines3's clip_range_vf: no gradient once V left the clip range).",
    )
    target_kl: float | None = Field(
        None,
        gt=0.0,
        description="Stop the update passes once the mean approx KL exceeds this (all ranks agree).",
    )


class PPOOptimConfig(_Section):
    """``spec.policy.optimCfg`` (Adam)."""

    lr: float = Field(2.5e-4, gt=0.0, description="Adam learning rate.")
    eps: float = Field(1e-5, gt=0.0, description="Adam epsilon.")
    max_grad_norm: float | None = Field(0.5, gt=0.0, description="Clip the global grad norm (null: off).")
    anneal_lr: bool = Field(
        False, description="Anneal the learning rate linearly to 0 over spec.train.maxEpochs."
    )


Activation = Literal["tanh", "relu", "elu", "gelu", "silu"]


class PPOModelConfig(_Section):
    """``spec.policy.modelCfg``: separate actor and critic MLPs."""

    hidden_sizes: list[Annotated[int, Field(ge=1)]] = Field(
        default_factory=lambda: [64, 64], description="Hidden layer widths of actor and critic."
    )
    activation: Activation = Field("tanh")
    init_log_std: float = Field(0.0, description="Initial log std of the Gaussian head (Box actions).")
    ortho_init: bool = Field(
        True, description="Orthogonal init as in CleanRL (gain sqrt 2; heads 0.01 and 1)."
    )
    encoder: Literal["mlp", "nature_cnn"] = Field(
        "mlp",
        description="mlp: separate actor/critic MLPs; nature_cnn: a shared Nature-DQN trunk for images "
        "(hiddenSizes and activation then do not apply).",
    )
    image_layout: Literal["auto", "hwc", "chw"] = Field(
        "auto", description="nature_cnn: axis order of an image observation (auto: trailing 1/3/4 is HWC)."
    )
    normalize_observation: bool = Field(
        False,
        description="mlp: normalise observations by running mean/var kept in the model (updated by the "
        "trainer after each update, shipped with every weight version, checkpointed).",
    )
    observation_clip: float = Field(10.0, gt=0.0, description="Clip normalised observations to +-this.")
    observation_stats: Literal["perUpdate", "perStep"] = Field(
        "perUpdate",
        description="With normalizeObservation, when the statistics move. perUpdate: the trainer merges "
        "each trained batch after the update (a rollout is normalised with one version's statistics). "
        "perStep: the acting policy also merges every observation before acting on it and ships the "
        "normalised observation in the fragment (Stable-Baselines3's VecNormalize); the trainer merges "
        "the same batch, so each version starts from the statistics the rollout ended with.",
    )

    @model_validator(mode="after")
    def _encoder_fits(self) -> PPOModelConfig:
        if self.encoder == "nature_cnn" and self.normalize_observation:
            raise ValueError(
                "normalizeObservation applies to the mlp encoder; nature_cnn scales images by 1/255"
            )
        if self.observation_stats == "perStep" and not self.normalize_observation:
            raise ValueError("observationStats perStep needs normalizeObservation: true")
        return self


Section = TypeVar("Section", bound=BaseModel)


def parse_section(model: type[Section], data: Mapping[str, Any] | None, *, path: str) -> Section:
    """Validate one config section; every problem is a line naming ``path.<key>``."""
    try:
        return model.model_validate(dict(data or {}))
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            where = ".".join([path, *(str(part) for part in err["loc"])]) if err["loc"] else path
            if err["type"] == "extra_forbidden":
                known = ", ".join(sorted(f.alias or name for name, f in model.model_fields.items()))
                problems.append(f"{where}: unknown key (known: {known})")
            else:
                message = str(err["msg"]).removeprefix("Input should be ").removeprefix("Value error, ")
                problems.append(f"{where}: got {err.get('input')!r}, expected {message}")
        raise SpecError(problems, source=path) from None
