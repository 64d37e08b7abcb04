"""RLightning's ``rlightning.utils`` import homes: ``registry``, ``logger``, ``profiler``."""
