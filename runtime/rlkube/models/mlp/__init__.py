"""RLightning's ``rlightning.models.mlp`` (empty there): rlkube's MLP builder (the built-in PPO's)."""

from rlkube.policy.builtin.actor_critic import mlp

__all__ = ["mlp"]
