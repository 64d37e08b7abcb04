"""RLightning's ``rlightning.types``: EnvRet, PolicyResponse, EnvMeta (their home is ``rlkube.envs``).

``Processed_EnvRet_fields`` names the per-step keys the buffer derives from EnvRets (rlkube's
fragments hold them too: ``next_observation``, ``reward``, ``terminated``, ``truncated``; ``info``
stays out of fragments, as non-numbers do).
"""

from rlkube.envs.types import EnvMeta, EnvRet, PolicyResponse

Processed_EnvRet_fields = ("next_observation", "reward", "terminated", "truncated", "info")

__all__ = ["EnvMeta", "EnvRet", "PolicyResponse", "Processed_EnvRet_fields"]
