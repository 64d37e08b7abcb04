"""RLightning's ``rlightning.env``: ``EnvMeta`` and ``EnvGroup`` (home: ``rlkube.envs``).

rlkube builds the envs from ``spec.env`` (a gymnasium id); RLightning's env classes (ManiSkill,
Isaac, LIBERO, ...) are not carried over: register such an env with gymnasium and name its id.
"""

from rlkube.envs.group import EnvGroup
from rlkube.envs.types import EnvMeta

__all__ = ["EnvGroup", "EnvMeta"]
