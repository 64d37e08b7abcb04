"""Environments: EnvGroup over gymnasium vector envs, and the EnvRet / PolicyResponse types.

``types`` is pure; ``group`` creates environments (in-process or in subprocesses).
"""

from rlkube.envs.group import EnvError, EnvGroup, check_env_id, replica_seed
from rlkube.envs.types import EnvMeta, EnvRet, PolicyResponse

__all__ = ["EnvError", "EnvGroup", "EnvMeta", "EnvRet", "PolicyResponse", "check_env_id", "replica_seed"]
