"""Operator start-up: every setting applied in one place (:func:`configure`), servers started.

High availability is a coordination.k8s.io Lease (:mod:`rlkube_operator.lease_election`): every
replica starts, serves /healthz and waits in the startup handler until it holds the Lease; kopf
starts its watchers only after the startup handlers, so a standby watches and writes nothing. A
leader that loses the Lease exits at once (its container restarts as a standby), as client-go's
controllers do. See docs/operations.md.

I/O. ``rlkube operator`` imports :mod:`rlkube_operator.handlers`, whose ``@kopf.on.startup``
handler calls :func:`configure` and :func:`start`; ``@kopf.on.cleanup`` calls :func:`stop`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from typing import Any

import kopf

from rlkube_operator import metrics
from rlkube_operator.kube import Kube
from rlkube_operator.lease_election import LeadershipLost, LeaseElector
from rlkube_operator.reconcile import Reconciler
from rlkube_operator.refresher import Refresher
from rlkube_operator.settings import OperatorSettings

ANNOTATION_PREFIX = "rlkube.io"
#: The exit status of a leader that lost its Lease (client-go's controllers exit 1 as well).
EXIT_LEADERSHIP_LOST = 1


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
    # One replica acts by holding the Lease (start()), not through kopf's peering.
    kopf_settings.peering.standalone = True


async def start(
    memo: Any, ours: OperatorSettings, *, logger: logging.Logger | logging.LoggerAdapter[Any]
) -> None:
    memo.settings = ours
    memo.kube = Kube.connect(field_manager=ours.field_manager, timeout=ours.api_timeout)
    memo.metrics_server = await metrics.start_server(port=ours.metrics_port)  # standbys answer too
    if ours.leader_election_lease:
        memo.elector = LeaseElector(
            memo.kube,
            namespace=ours.render.operator_namespace,
            name=ours.leader_election_lease,
            identity=replica_identity(),
            duration_s=ours.lease_duration,
        )
        logger.info(f"rlkube operator {memo.elector.identity}: waiting to hold {memo.elector.where}")
        await memo.elector.acquire()
        metrics.LEADER.set(1)
        memo.lease_task = asyncio.get_running_loop().create_task(_lead(memo.elector, logger))
    memo.reconciler = Reconciler(kube=memo.kube, settings=ours)
    memo.refresher = Refresher(reconciler=memo.reconciler, kube=memo.kube, interval=ours.status_interval)
    memo.refresher_task = asyncio.get_running_loop().create_task(memo.refresher.run())
    logger.info(
        f"rlkube operator: namespaces {', '.join(ours.namespaces) or 'all'}, "
        f"metrics and /healthz on :{ours.metrics_port}, status every {ours.status_interval}s, "
        + (f"leading: holds {memo.elector.where}" if ours.leader_election_lease else "standalone")
    )


def replica_identity() -> str:
    """The pod's name (its hostname, as the container runtime sets it) and a random suffix: a
    restarted container is a new holder."""
    return f"{os.environ.get('HOSTNAME') or socket.gethostname()}_{uuid.uuid4().hex[:8]}"


async def _lead(elector: LeaseElector, logger: logging.Logger | logging.LoggerAdapter[Any]) -> None:
    """Renew the Lease; when it is lost, exit at once: no write may follow (the next leader acts)."""
    try:
        await elector.keep()
    except LeadershipLost as exc:
        logger.error(f"rlkube operator: leadership lost ({exc}); exiting, to restart as a standby")
        logging.shutdown()
        os._exit(EXIT_LEADERSHIP_LOST)


async def stop(memo: Any) -> None:
    for name in ("refresher_task", "lease_task"):
        task = getattr(memo, name, None)
        if task is not None:
            task.cancel()
    elector = getattr(memo, "elector", None)
    if elector is not None:
        await asyncio.to_thread(elector.release)
        metrics.LEADER.set(0)
    server = getattr(memo, "metrics_server", None)
    if server is not None:
        await server.cleanup()
    kube = getattr(memo, "kube", None)
    if kube is not None:
        kube.close()
