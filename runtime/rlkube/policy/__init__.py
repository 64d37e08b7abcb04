"""Policies: the BasePolicy contract, roles, the registry and the built-in policies."""

from rlkube.policy.base import BasePolicy, PolicyRole, RequestMode
from rlkube.policy.registry import POLICIES, Registry, import_modules

# Built-in policies register themselves on import.
from rlkube.policy import builtin as _builtin  # noqa: F401  isort: skip

__all__ = ["POLICIES", "BasePolicy", "PolicyRole", "Registry", "RequestMode", "import_modules"]
