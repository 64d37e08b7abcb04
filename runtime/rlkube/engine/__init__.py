"""Engines: the loops that drive rollout, training and weight publication.

``rollout`` (the one rollout loop: RolloutWorker), ``trainer`` (what every rank-0 engine shares,
and the follower ranks' loop), ``sync_engine``, ``async_engine``, ``eval_engine`` (the loops),
``worker`` (an eval pod's life), ``checkpoint`` (atomic, verified checkpoints and the completion
marker), ``tracker`` (pure run bookkeeping), ``report`` (records, summary and the
TensorBoard/plot/summary observers), ``run_paths`` (the run directory layout). The same engines
run in a cluster and in one process (``rlkube.launch.in_process``).
"""
