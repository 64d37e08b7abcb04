"""Operator start-up: every setting applied in one place (:func:`configure`), servers started.

High availability is kopf's peering: every replica runs, exactly one acts (the oldest live one),
the others are paused by kopf itself (no watch, no handler, no timer) until it is gone. See
:func:`peering_priority` and docs/operations.md.

I/O. ``rlkube operator`` imports :mod:`rlkube_operator.handlers`, whose ``@kopf.on.startup``
handler calls :func:`configure` and :func:`start`; ``@kopf.on.cleanup`` calls :func:`stop`.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from typing import Any

import kopf

from rlkube_operator import metrics
from rlkube_operator.kube import Kube
from rlkube_operator.reconcile import Reconciler
from rlkube_operator.refresher import Refresher
from rlkube_operator.settings import OperatorSettings

ANNOTATION_PREFIX = "rlkube.io"


def configure(kopf_settings: kopf.OperatorSettings, ours: OperatorSettings) -> None:
    """Translate our settings into kopf's (watch timeouts, storage, events, threads)."""
    kopf_settings.watching.server_timeout = ours.watch_server_timeout
    kopf_settings.watching.client_timeout = ours.watch_client_timeout
    kopf_settings.watching.connect_timeout = min(10.0, ours.api_timeout)
    kopf_settings.networking.request_timeout = ours.api_timeout
    kopf_settings.networking.connect_timeout = min(10.0, ours.api_timeout)
    # Keep kopf's bookkeeping in annotations so status stays ours alone.
    kopf_settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=ANNOTATION_PREFIX)
    kopf_settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=ANNOTATION_PREFIX, key="last-handled-configuration"
    )
    # No handler needs a finalizer (no timers or daemons, an optional on.delete), so kopf adds none
    # and removes this one from jobs an older operator marked: `kubectl delete rlj` never waits on us.
    kopf_settings.persistence.finalizer = f"{ANNOTATION_PREFIX}/finalizer"
    # Our own events say what happened; kopf posts only its warnings and errors.
    kopf_settings.posting.level = logging.WARNING
    kopf_settings.execution.max_workers = ours.workers
    configure_peering(kopf_settings, ours, started=time.time())


def peering_priority(started: float, *, tie_breaker: int) -> int:
    """The older replica has the higher priority: a replica that starts later never preempts.

    kopf pauses every operator that sees a live peer of higher (or equal) priority, and a new
    replica is paused from its first look at the peering object, so an operator that starts while
    another acts waits; it takes over only when the acting one is gone (it removes its record on
    SIGTERM; a killed one's record runs out after RLKUBE_PEERING_LIFETIME). ``tie_breaker``
    (0..999) separates two replicas started in the same millisecond, which would otherwise both
    pause.
    """
    return -(int(started * 1000) * 1000 + tie_breaker)


def configure_peering(
    kopf_settings: kopf.OperatorSettings, ours: OperatorSettings, *, started: float
) -> None:
    """Leader election by kopf's peering (one ClusterKopfPeering per release), or standalone."""
    if not ours.peering:
        kopf_settings.peering.standalone = True
        return
    kopf_settings.peering.standalone = False
    kopf_settings.peering.mandatory = True  # paused until the peering object is seen, never unpeered
    kopf_settings.peering.clusterwide = True  # one object, whichever namespaces the operator serves
    kopf_settings.peering.name = ours.peering
    kopf_settings.peering.lifetime = ours.peering_lifetime
    kopf_settings.peering.priority = peering_priority(started, tie_breaker=random.randrange(1000))
    kopf_settings.peering.stealth = True  # keep-alives are not logged


async def start(
    memo: Any, ours: OperatorSettings, *, logger: logging.Logger | logging.LoggerAdapter[Any]
) -> None:
    memo.settings = ours
    memo.kube = Kube.connect(field_manager=ours.field_manager, timeout=ours.api_timeout)
    memo.reconciler = Reconciler(kube=memo.kube, settings=ours)
    memo.refresher = Refresher(reconciler=memo.reconciler, kube=memo.kube, interval=ours.status_interval)
    memo.refresher_task = asyncio.get_running_loop().create_task(memo.refresher.run())
    memo.metrics_server = await metrics.start_server(port=ours.metrics_port)
    logger.info(
        f"rlkube operator: namespaces {', '.join(ours.namespaces) or 'all'}, "
        f"metrics and /healthz on :{ours.metrics_port}, status every {ours.status_interval}s, "
        + (f"leader election through ClusterKopfPeering {ours.peering}" if ours.peering else "standalone")
    )


async def stop(memo: Any) -> None:
    task = getattr(memo, "refresher_task", None)
    if task is not None:
        task.cancel()
    server = getattr(memo, "metrics_server", None)
    if server is not None:
        await server.cleanup()
    kube = getattr(memo, "kube", None)
    if kube is not None:
        kube.close()
