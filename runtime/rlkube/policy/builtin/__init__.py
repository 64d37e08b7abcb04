"""Built-in policies; importing this package registers them in POLICIES.

``ppo`` (the ``PPO`` policy), ``actor_critic`` (its network), ``ppo_config`` (its settings) and
``ppo_math`` (pure maths: GAE, clipped surrogate, value loss).
"""

from rlkube.policy.builtin.ppo import PPO

__all__ = ["PPO"]
