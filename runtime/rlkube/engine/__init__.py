"""Engines: the loops that drive rollout, training and weight publication.

``rollout`` (the one rollout loop: RolloutWorker), ``in_process`` (train and eval roles in one
process), ``checkpoint`` (atomic, verified checkpoints and the completion marker), ``tracker``
(pure run bookkeeping), ``report`` (records, summary and the TensorBoard/plot/summary observers),
``run_paths`` (the run directory layout).
"""
