"""RLightning's ``rlightning.utils.registry``: the POLICIES registry (home: ``rlkube.policy.registry``)."""

from rlkube.policy.registry import POLICIES, Registry

__all__ = ["POLICIES", "Registry"]
