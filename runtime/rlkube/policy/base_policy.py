"""RLightning's ``rlightning.policy.base_policy``: BasePolicy, PolicyRole (home: ``rlkube.policy.base``)."""

from rlkube.policy.base import BasePolicy, PolicyRole

__all__ = ["BasePolicy", "PolicyRole"]
