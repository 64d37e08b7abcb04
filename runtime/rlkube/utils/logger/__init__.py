"""RLightning's ``rlightning.utils.logger``: ``get_logger``, ``log_metric``, ``setup_logger``.

On rlkube these sit on Python's ``logging``, which ``rlkube run`` and the pod entrypoint configure
(console and pod log, with the job's level). Figures a policy wants on the job's charts go through
``self.log_metric(key, value)`` in ``train`` (TensorBoard, the summary, the coordinator status);
``log_metric`` here writes a dict of figures to the log, one line, as RLightning does on a console.
"""

from rlkube.utils.logger.logger import get_logger, log_metric, setup_logger

__all__ = ["get_logger", "log_metric", "setup_logger"]
