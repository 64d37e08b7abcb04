"""rlkube: reinforcement learning on Kubernetes.

What users import: ``rlkube.policy`` (BasePolicy, PolicyRole, POLICIES), ``rlkube.types``
(EnvRet, PolicyResponse) and ``rlkube.utils.registry`` (POLICIES), the homes RLightning users
know. Layers, lowest first (checked by import-linter, see .importlinter, which is the source):
``config``/``run_policy``/``weight_key`` < ``spec``/``contract`` < ``jobfile`` < ``data`` <
``envs`` < ``policy`` < ``weights`` < ``coordinator`` < ``engine`` < ``launch`` < ``cli``.
"""

__version__ = "0.1.0"
