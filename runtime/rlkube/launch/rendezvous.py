"""The train ranks' rendezvous: every rank joins the group of the rank 0 that is running now.

I/O (TCP, through torch.distributed's TCPStore). ``init_method="tcp://..."`` alone lets a restarted
rank join a rank 0 that is about to fail: when train rank 1 is killed and its pod restarts it
within seconds, the old rank 0 may still be tearing down (its store still serving, its group's
keys still in it). The new rank 1 then read the old group's addresses, retried a connection to a
peer that was gone for the whole rendezvous timeout (10 minutes), while the new rank 0 waited for
it: a restart that should take seconds took ten minutes of every rank's GPU.

So rank 0 hosts the store itself and opens one rendezvous per run, under a name of its own
(``OPEN_KEY`` holds it while rank 0 waits for the other ranks), and closes it once every rank has
joined. A rank that finds no open rendezvous on the store it reached waits: that rank 0 formed its
group before this rank started and will fail with the peer it lost, closing the connection, and
the rank then connects again, to its successor. The group's keys live under the rendezvous's name,
so no rank can read another run's.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from datetime import timedelta

import torch.distributed as dist

from rlkube.engine.trainer import Stopped

logger = logging.getLogger(__name__)

#: Set on rank 0's store while its rendezvous waits for ranks: the name the group's keys live under.
OPEN_KEY = "rlkube/rendezvous"
#: How often a waiting rank looks at its stop event.
POLL = timedelta(seconds=2)
#: How long one attempt to reach rank 0's store lasts (torch logs each failed one).
CONNECT_ATTEMPT = timedelta(seconds=5)


class RendezvousTimeout(RuntimeError):
    """The other ranks did not all join within the rendezvous timeout."""


def join_process_group(
    *,
    backend: str,
    master_addr: str,
    master_port: int,
    rank: int,
    world_size: int,
    timeout: timedelta,
    stop: threading.Event,
) -> str:
    """Form the default process group with the rank 0 running now; the rendezvous's name."""
    deadline = time.monotonic() + timeout.total_seconds()
    if rank == 0:
        store, name = _open(master_addr, master_port, world_size, timeout, deadline, stop)
    else:
        store, name = _join(master_addr, master_port, rank, world_size, deadline, stop)
    store.set_timeout(timeout)
    dist.init_process_group(
        backend=backend,
        store=dist.PrefixStore(name, store),
        rank=rank,
        world_size=world_size,
        timeout=timeout,
    )
    return name


def _open(
    host: str, port: int, world_size: int, timeout: timedelta, deadline: float, stop: threading.Event
) -> tuple[dist.TCPStore, str]:
    store = dist.TCPStore(host, port, world_size, is_master=True, timeout=timeout, wait_for_workers=False)
    name = f"rlkube/{uuid.uuid4().hex}"
    store.set(OPEN_KEY, name)
    logger.info("rendezvous %s open on port %d for %d ranks", name, port, world_size)
    _wait_for_key(store, f"{name}/all", deadline, stop, what=_others(world_size))
    store.delete_key(OPEN_KEY)  # a rank that starts from now on waits for the next rank 0
    return store, name


def _others(world_size: int) -> str:
    return "train rank 1 to join" if world_size == 2 else f"train ranks 1-{world_size - 1} to join"


def _join(
    host: str, port: int, rank: int, world_size: int, deadline: float, stop: threading.Event
) -> tuple[dist.TCPStore, str]:
    what = f"rank 0 at {host}:{port} to open a rendezvous"
    while True:
        store = _connect(host, port, world_size, deadline, stop, what=what)
        try:
            _wait_for_key(store, OPEN_KEY, deadline, stop, what=what)
        except dist.DistNetworkError:
            # That rank 0 formed its group before this rank started, and is gone now: its successor's next.
            logger.info("rank 0 at %s:%d closed the connection; connecting to the next one", host, port)
            continue
        name = store.get(OPEN_KEY).decode()
        if store.add(f"{name}/joined", 1) == world_size - 1:
            store.set(f"{name}/all", "1")
        logger.info("rank %d joined rendezvous %s", rank, name)
        return store, name


def _connect(
    host: str, port: int, world_size: int, deadline: float, stop: threading.Event, *, what: str
) -> dist.TCPStore:
    """A client of rank 0's store, once one serves (torch retries refused connections itself)."""
    while True:
        left = _check(deadline, stop, what=what)
        attempt = timedelta(seconds=max(1.0, min(CONNECT_ATTEMPT.total_seconds(), left)))
        try:
            return dist.TCPStore(
                host, port, world_size, is_master=False, timeout=attempt, wait_for_workers=False
            )
        except dist.DistNetworkError:
            continue


def _wait_for_key(
    store: dist.TCPStore, key: str, deadline: float, stop: threading.Event, *, what: str
) -> None:
    """Until ``key`` is set; a lost connection raises ``DistNetworkError`` (not a ``DistStoreError``)."""
    logged = False
    while True:
        left = _check(deadline, stop, what=what)
        try:
            store.wait([key], min(POLL, timedelta(seconds=left)))
            return
        except dist.DistStoreError:  # this poll's timeout: the store answers, the key is not there yet
            if not logged:
                logger.info("waiting for %s", what)
                logged = True


def _check(deadline: float, stop: threading.Event, *, what: str) -> float:
    """Seconds left before ``deadline``; raises once it passed or the rank was asked to stop."""
    if stop.is_set():
        raise Stopped(f"stopped while waiting for {what}")
    left = deadline - time.monotonic()
    if left <= 0:
        raise RendezvousTimeout(f"timed out waiting for {what}")
    return left
