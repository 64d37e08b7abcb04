"""RLightning's ``rlightning.utils.config``: its config classes are the RLJob's sections here.

For type annotations and ``isinstance`` checks in ported policies: ``PolicyConfig`` is what
``self.config`` is (``spec.policy``), ``TrainConfig`` what ``init_train`` receives
(``spec.train``), ``Config`` the free-form sections (``modelCfg``, ``optimCfg``, ``algoCfg``,
``trainConfig``). Jobs are written as RLJob YAML (docs/porting-from-rlightning.md), not built
from these classes.
"""

from rlkube.config import Config
from rlkube.spec import BufferSpec as BufferConfig
from rlkube.spec import EnvSpec as EnvConfig
from rlkube.spec import PolicySpec as PolicyConfig
from rlkube.spec import RLJobSpec as MainConfig
from rlkube.spec import TrainSpec as TrainConfig
from rlkube.spec import WeightBufferSpec as WeightBufferConfig

__all__ = [
    "BufferConfig",
    "Config",
    "EnvConfig",
    "MainConfig",
    "PolicyConfig",
    "TrainConfig",
    "WeightBufferConfig",
]
