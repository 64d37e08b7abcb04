"""Prometheus metrics of the job's pods: train ranks and eval workers (the operator has its own).

The bottom layer of the runtime: it imports only ``prometheus_client``, so every layer above
(weights, coordinator, engine) records into it, and nothing here knows their types.

* :mod:`~rlkube.metrics.series` (no I/O): every series, on three registries by who exports it:
  :data:`~rlkube.metrics.series.RANK_ZERO` (train rank 0: progress and trajectories, read from the
  coordinator at scrape time), :data:`~rlkube.metrics.series.TRAIN` (every train rank: publishing
  and serving weights) and :data:`~rlkube.metrics.series.EVAL` (eval workers: loads, rollouts,
  fetches). docs/operations.md ("Monitoring") lists them.
* :mod:`~rlkube.metrics.server` (I/O): ``/metrics`` over HTTP on the pod's ``RLKUBE_METRICS_PORT``.
"""
