"""RLightning-compatible import homes (``rlkube.utils.registry``)."""
