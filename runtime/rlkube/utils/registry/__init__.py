"""RLightning's ``rlightning.utils.registry``: the registries and ``load_modules_from_config``.

``POLICIES`` is rlkube's own (``rlkube.policy.registry``), the one ``spec.policy.type`` is looked
up in. ``BUFFERS``, ``WEIGHTS``, ``ENVS`` and ``ENGINE`` exist so that modules decorating classes
with them import and register; rlkube picks buffers, weight strategies, envs and engines from the
RLJob's fields instead (docs/porting-from-rlightning.md says which).
"""

from rlkube.utils.registry.modules_loader import load_modules_from_config
from rlkube.utils.registry.registry import Registry

from rlkube.policy.registry import POLICIES  # isort: skip

BUFFERS: Registry = Registry("buffer")
WEIGHTS: Registry = Registry("weights")
ENVS: Registry = Registry("env")
ENGINE: Registry = Registry("engine")

__all__ = ["BUFFERS", "ENGINE", "ENVS", "POLICIES", "WEIGHTS", "Registry", "load_modules_from_config"]
