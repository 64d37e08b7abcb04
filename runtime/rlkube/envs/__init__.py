"""Environments: EnvGroup over gymnasium vector envs or envpool, and the EnvRet / PolicyResponse types.

``types`` and ``envpool_options`` are pure; ``group`` creates environments (in-process or in subprocesses).
"""

from rlkube.envs.group import EnvError, EnvGroup, check_env, check_env_id, replica_seed
from rlkube.envs.types import EnvMeta, EnvRet, PolicyResponse

__all__ = [
    "EnvError",
    "EnvGroup",
    "EnvMeta",
    "EnvRet",
    "PolicyResponse",
    "check_env",
    "check_env_id",
    "replica_seed",
]
