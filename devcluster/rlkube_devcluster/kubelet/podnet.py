"""The cluster-in-a-box's network: every pod on 127.0.0.1, with ports chosen per job.

Nothing resolves cluster DNS here and every pod shares one host, so the kubelet rewrites the
service names and ports of the env contract (``rlkube.contract``) in the env of an RLJob's pods
(label ``rlkube.io/job-name``) before it starts them:

=============================================  ===============================================
variable (value rendered by the operator)      value the process gets
=============================================  ===============================================
``MASTER_ADDR``, ``PET_MASTER_ADDR``           ``127.0.0.1``
(``<job>-train-0.<job>-train.<ns>.svc``)
``MASTER_PORT``, ``PET_MASTER_PORT`` (29500)   the job's rendezvous port
``RLKUBE_COORDINATOR_ADDR``                    ``127.0.0.1:<the job's coordinator port>``
(``<job>-coordinator.<ns>.svc:50051``)
``RLKUBE_WEIGHT_PORT`` (50052)                 train rank r: the job's weight port of rank r (every
                                               rank serves weights, so each needs its own);
                                               eval pods: rank 0's
``RLKUBE_WEIGHT_DATA_PORT`` (50054)            ``0``: the kernel picks one per train rank (receivers
                                               learn it over gRPC, at the weight server's host)
``RLKUBE_METRICS_PORT`` (8000)                 a port per pod (role, index): every pod serves
                                               ``/metrics``, and here they share one host
=============================================  ===============================================

Ports are free ports picked when a job's first pod starts and kept while any of its pods runs,
as ``runtime/rlkube/launch/local.py`` does for ``rlkube run``. The operator reaches a job's
coordinator through the coordinator Service; here :class:`ServiceProxy` stands in for it (and for
kube-proxy): a unix socket ``<socket_dir>/<namespace>.<job>.sock`` forwarding to the coordinator
port, so the operator runs with ``RLKUBE_COORDINATOR_ADDRESS=unix://<socket_dir>/{namespace}.{job}.sock``
and needs nothing else.

:func:`cluster_addresses` is pure; :class:`JobNetworks` (each job's ports and proxy) and
:class:`ServiceProxy` run on an event loop (:class:`.network_thread.NetworkThread`'s).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from rlkube import contract
from rlkube.launch.processes import free_port

LOOPBACK = "127.0.0.1"


@dataclass
class JobPorts:
    """The ports of one job's pods on this host."""

    coordinator: int
    master: int
    weights: dict[int, int] = field(default_factory=dict)
    metrics: dict[tuple[str, str], int] = field(default_factory=dict)

    @classmethod
    def allocate(cls) -> JobPorts:
        return cls(coordinator=free_port(), master=free_port())

    def metrics_port(self, pod: tuple[str, str]) -> int:
        """The /metrics port of pod (role, replica index)."""
        if pod not in self.metrics:
            self.metrics[pod] = free_port()
        return self.metrics[pod]

    def weight(self, rank: int) -> int:
        if rank not in self.weights:
            self.weights[rank] = free_port()
        return self.weights[rank]


def cluster_addresses(env: Mapping[str, str], *, job: str, namespace: str, ports: JobPorts) -> dict[str, str]:
    """The env with the job's service names and ports replaced by this host's (see the table above)."""
    out = dict(env)
    names = {contract.master_addr(job, namespace): LOOPBACK}
    names[contract.coordinator_addr(job, namespace)] = f"{LOOPBACK}:{ports.coordinator}"
    for name, value in env.items():
        if value in names:
            out[name] = names[value]
        elif name in ("MASTER_PORT", "PET_MASTER_PORT") and value == str(contract.MASTER_PORT):
            out[name] = str(ports.master)
    if env.get("RLKUBE_WEIGHT_PORT") == str(contract.WEIGHT_PORT):
        train = env.get("RLKUBE_ROLE") == contract.Role.TRAIN.value
        rank = int(env.get("RLKUBE_REPLICA_INDEX", "0") or 0) if train else 0
        out["RLKUBE_WEIGHT_PORT"] = str(ports.weight(rank))
    if env.get("RLKUBE_WEIGHT_DATA_PORT") == str(contract.WEIGHT_DATA_PORT):
        out["RLKUBE_WEIGHT_DATA_PORT"] = "0"
    if env.get("RLKUBE_METRICS_PORT") == str(contract.METRICS_PORT):
        pod = (env.get("RLKUBE_ROLE", ""), env.get("RLKUBE_REPLICA_INDEX", ""))
        out["RLKUBE_METRICS_PORT"] = str(ports.metrics_port(pod))
    return out


class JobNetworks:
    """The ports and coordinator proxy of every job that has pods on this host (on its event loop)."""

    def __init__(self, socket_dir: Path) -> None:
        self.socket_dir = socket_dir
        self._jobs: dict[tuple[str, str], tuple[JobPorts, ServiceProxy, asyncio.Task[ServiceProxy]]] = {}

    def ports(self, namespace: str, job: str) -> JobPorts:
        """The job's ports; the first call picks them and opens its coordinator proxy."""
        key = (namespace, job)
        if key not in self._jobs:
            ports = JobPorts.allocate()
            proxy = ServiceProxy(proxy_socket(self.socket_dir, namespace, job), ports.coordinator)
            self._jobs[key] = (ports, proxy, asyncio.get_running_loop().create_task(proxy.start()))
        return self._jobs[key][0]

    def get(self, namespace: str, job: str) -> JobPorts | None:
        found = self._jobs.get((namespace, job))
        return None if found is None else found[0]

    def release_all_but(self, busy: set[tuple[str, str]]) -> None:
        """Forget the ports of jobs without pods here and close their proxies."""
        for key in [k for k in self._jobs if k not in busy]:
            _, proxy, started = self._jobs.pop(key)
            asyncio.get_running_loop().create_task(_close(proxy, started))

    async def close(self) -> None:
        for _, proxy, started in self._jobs.values():
            await _close(proxy, started)
        self._jobs.clear()


async def _close(proxy: ServiceProxy, started: asyncio.Task[ServiceProxy]) -> None:
    with contextlib.suppress(OSError):  # it never opened: nothing to close but the path
        await started
    await proxy.close()


def proxy_socket(socket_dir: Path, namespace: str, job: str) -> Path:
    return socket_dir / f"{namespace}.{job}.sock"


class ServiceProxy:
    """A unix socket that forwards each connection to ``127.0.0.1:port`` (a Service, as kube-proxy does)."""

    def __init__(self, path: Path, port: int) -> None:
        self.path = path
        self.port = port
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._inode: int | None = None

    async def start(self) -> ServiceProxy:
        self.path.unlink(missing_ok=True)
        self._server = await asyncio.start_unix_server(self._connect, path=str(self.path))
        self._inode = self.path.stat().st_ino
        return self

    async def _connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            try:
                upstream_reader, upstream_writer = await asyncio.open_connection(LOOPBACK, self.port)
            except OSError:
                return  # nothing listens yet: the caller sees the connection close (UNAVAILABLE)
            try:
                await asyncio.gather(_pipe(reader, upstream_writer), _pipe(upstream_reader, writer))
            finally:
                upstream_writer.close()
        except asyncio.CancelledError:
            # close() ended this connection. Python 3.11's stream server asks a cancelled handler
            # task for its exception and logs the CancelledError as an error; ending here does not.
            return
        finally:
            writer.close()
            self._tasks.discard(task)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for task in list(self._tasks):
                task.cancel()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None
        # The path may be a newer proxy's by now (the job's pods came back while this one closed).
        with contextlib.suppress(OSError):
            if self._inode is None or self.path.stat().st_ino == self._inode:
                self.path.unlink()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.write_eof()
