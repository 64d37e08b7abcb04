"""Environments: EnvGroup over gymnasium vector envs, and the EnvRet / PolicyResponse types."""

from rlkube.envs.types import EnvMeta, EnvRet, PolicyResponse

__all__ = ["EnvMeta", "EnvRet", "PolicyResponse"]
