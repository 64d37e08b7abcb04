"""RLightning's ``rlightning.models`` import home: the networks its shipped policies build.

``rlkube.models.vision.NatureCNN`` keeps RLightning's constructor and attributes on top of the
built-in PPO's Nature-DQN trunk (``rlkube.policy.builtin.encoders``); ``rlkube.models.mlp`` holds
the built-in MLP builder. Pure: no I/O.
"""
