"""Run the emulator, its controllers and a kubelet on a background thread; write kubeconfigs.

``EmulatedCluster`` is what tests and ``make cluster`` start. ``call(fn, ...)`` runs ``fn`` on the
emulator's loop (the only thread that may touch the store) and returns its result.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import kmock
import yaml

from rlkube_devcluster.emulator.controllers import (
    DanglingOwnerCollector,
    Kubelet,
    ReadyKubelet,
    StatefulSetController,
)
from rlkube_devcluster.emulator.server import Emulator

T = TypeVar("T")

ADMIN_TOKEN = "admin"
OPERATOR_TOKEN = "rlkube-operator"


def kubeconfig(url: str, *, token: str, namespace: str = "default") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "emulator", "cluster": {"server": url}}],
        "users": [{"name": token, "user": {"token": token}}],
        "contexts": [
            {"name": "emulator", "context": {"cluster": "emulator", "user": token, "namespace": namespace}}
        ],
        "current-context": "emulator",
    }


class EmulatedCluster:
    def __init__(
        self,
        workdir: Path,
        *,
        kubelet: Kubelet | None = None,
        port: int | None = None,
        crds: Sequence[Path] = (),
    ) -> None:
        self.workdir = workdir
        self.kubelet = kubelet if kubelet is not None else ReadyKubelet()
        self.port = port
        self.crds = list(crds)
        self.emulator: Emulator | None = None
        self.url = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    @property
    def kubeconfig(self) -> Path:
        """For people and kubectl (user ``admin``)."""
        return self.workdir / "kubeconfig"

    @property
    def operator_kubeconfig(self) -> Path:
        """For the operator (user ``rlkube-operator``; its requests are audited against rbac.RULES)."""
        return self.workdir / "operator-kubeconfig"

    def start(self, timeout: float = 30.0) -> EmulatedCluster:
        self._thread = threading.Thread(target=self._main, name="api-emulator", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError("the API emulator did not start")
        if self._error is not None:
            raise RuntimeError("the API emulator failed to start") from self._error
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.kubeconfig.write_text(yaml.safe_dump(kubeconfig(self.url, token=ADMIN_TOKEN)))
        self.operator_kubeconfig.write_text(yaml.safe_dump(kubeconfig(self.url, token=OPERATOR_TOKEN)))
        return self

    def _main(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:
            self._error = exc
            self._ready.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        emulator = Emulator()
        async with emulator, kmock.Server(emulator, host="127.0.0.1", port=self.port) as server:
            self.emulator = emulator
            self.url = f"http://127.0.0.1:{server.port}"
            StatefulSetController(emulator.store)
            DanglingOwnerCollector(emulator.store)
            self.kubelet.attach(emulator.store)
            emulator.pod_logs = getattr(self.kubelet, "container_log", None)
            crd_type = emulator.store.find("apiextensions.k8s.io", "v1", "customresourcedefinitions")
            assert crd_type is not None
            for path in self.crds:
                for document in yaml.safe_load_all(path.read_text()):
                    if document:
                        emulator.store.create(crd_type, None, document)
            self._ready.set()
            await self._stop.wait()
            emulator.shutdown()
            await self.kubelet.close()

    def call(self, fn: Callable[..., T], *args: Any, timeout: float = 30.0, **kwargs: Any) -> T:
        """Run ``fn(*args, **kwargs)`` on the emulator's loop and return what it returns."""
        assert self._loop is not None

        async def run() -> T:
            return fn(*args, **kwargs)

        future: concurrent.futures.Future[T] = asyncio.run_coroutine_threadsafe(run(), self._loop)
        return future.result(timeout)

    def create_namespace(self, name: str) -> None:
        store = self.store_call

        def create() -> None:
            ns_type = store().find("", "v1", "namespaces")
            assert ns_type is not None
            if store().get(ns_type, None, name) is None:
                store().create(ns_type, None, {"metadata": {"name": name}})

        self.call(create)

    def store_call(self) -> Any:
        assert self.emulator is not None
        return self.emulator.store

    def stop(self, timeout: float = 30.0) -> None:
        if self._loop is not None and self._stop is not None and self._thread and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(timeout)
