"""RLightning's ``rlightning.types``: EnvRet and PolicyResponse (their home is ``rlkube.envs``)."""

from rlkube.envs.types import EnvMeta, EnvRet, PolicyResponse

__all__ = ["EnvMeta", "EnvRet", "PolicyResponse"]
