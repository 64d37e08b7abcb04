"""The job networks (:class:`.podnet.JobNetworks`) of the node agents, on an event loop thread of their own.

Every node agent of one machine shares one: a job's ports must be the same whichever agent runs
its pod, and its coordinator proxy (the operator's way in) must exist once.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from rlkube_devcluster.kubelet.podnet import JobNetworks, JobPorts, proxy_socket


class NetworkThread:
    def __init__(self, socket_dir: Path) -> None:
        self.socket_dir = socket_dir
        self.loop = asyncio.new_event_loop()
        self.networks = JobNetworks(socket_dir)
        self._lock = threading.Lock()
        self._busy: dict[str, set[tuple[str, str]]] = {}
        self.thread = threading.Thread(target=self.loop.run_forever, name="job-networks", daemon=True)
        self.thread.start()

    def ports(self, namespace: str, job: str) -> JobPorts:
        """The job's ports (the first call picks them and opens its coordinator proxy)."""

        async def ports() -> JobPorts:
            return self.networks.ports(namespace, job)

        return asyncio.run_coroutine_threadsafe(ports(), self.loop).result()

    def get(self, namespace: str, job: str) -> JobPorts | None:
        """The job's ports if it has any now."""

        async def get() -> JobPorts | None:
            return self.networks.get(namespace, job)

        return asyncio.run_coroutine_threadsafe(get(), self.loop).result()

    def busy(self, agent: str, jobs: set[tuple[str, str]]) -> None:
        """``agent`` has pods of ``jobs`` (namespace, job) now; jobs no agent has are released
        (their ports forgotten, their coordinator proxy closed)."""
        with self._lock:
            self._busy[agent] = set(jobs)
            union = set().union(*self._busy.values())

        async def release() -> None:
            self.networks.release_all_but(union)

        asyncio.run_coroutine_threadsafe(release(), self.loop).result()

    def coordinator_socket(self, namespace: str, job: str) -> Path:
        return proxy_socket(self.socket_dir, namespace, job)

    def coordinator_target(self, namespace: str, job: str) -> str:
        """Where a job's coordinator answers from outside the pods (the operator's address)."""
        return f"unix://{self.coordinator_socket(namespace, job)}"

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.networks.close(), self.loop).result()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()
