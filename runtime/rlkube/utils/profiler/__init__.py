"""RLightning's ``rlightning.utils.profiler``: ``from rlkube.utils.profiler import profiler``."""

from rlkube.utils.profiler import profiler

__all__ = ["profiler"]
