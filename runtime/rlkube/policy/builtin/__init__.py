"""Built-in policies; importing this package registers them in POLICIES.

``ppo`` (the ``PPO`` policy), ``actor_critic`` (its network), ``ppo_config`` (its settings) and
``ppo_math`` (pure maths: GAE, clipped surrogate, value loss), ``ppo_vtrace`` (its correction of stale
rows); ``sac`` (the ``SAC`` policy), ``sac_networks``, ``sac_config`` and ``sac_math``;
``rsl_rl_policy`` (``RSLRLPolicy``: the rsl_rl library's PPO, imported when used).
"""

from rlkube.policy.builtin.ppo import PPO
from rlkube.policy.builtin.rsl_rl_policy import RSLRLPolicy
from rlkube.policy.builtin.sac import SAC

__all__ = ["PPO", "SAC", "RSLRLPolicy"]
