"""RLightning's ``rlightning.utils.registry.registry``: the ``Registry`` class (rlkube's own)."""

from rlkube.policy.registry import Registry

__all__ = ["Registry"]
