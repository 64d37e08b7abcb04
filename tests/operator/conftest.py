"""Fixtures: one emulated cluster and one real operator per test module; a namespace per test."""

from __future__ import annotations

import itertools
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from rlkube_devcluster.coordinators import FakeCoordinators
from rlkube_devcluster.emulator.cluster import EmulatedCluster
from rlkube_devcluster.operator_process import OperatorProcess
from rlkube_devcluster.waiting import wait_for

from tests.operator.harness import ROOT, kubectl

_COUNTER = itertools.count()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    # unix socket paths must stay short (108 bytes): keep the directory name small
    path = tmp_path_factory.mktemp("op")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster(workdir: Path) -> Iterator[EmulatedCluster]:
    emulated = EmulatedCluster(workdir, crds=[ROOT / "crds" / "rljob.yaml"]).start()
    yield emulated
    emulated.stop()


@pytest.fixture(scope="module")
def coordinators(workdir: Path) -> Iterator[FakeCoordinators]:
    sockets = workdir / "s"
    sockets.mkdir(exist_ok=True)
    fakes = FakeCoordinators(sockets)
    yield fakes
    fakes.stop()


@pytest.fixture(scope="module")
def operator(
    cluster: EmulatedCluster, coordinators: FakeCoordinators, workdir: Path
) -> Iterator[OperatorProcess]:
    process = OperatorProcess(
        cluster.operator_kubeconfig, socket_dir=coordinators.socket_dir, log=workdir / "operator.log"
    ).start()
    yield process
    process.stop()


class Kubectl:
    """kubectl against the emulated cluster, in one namespace."""

    def __init__(self, cluster: EmulatedCluster, namespace: str) -> None:
        self.cluster = cluster
        self.namespace = namespace

    def __call__(self, *args: str, input: str | None = None, check: bool = True) -> Any:
        return kubectl(self.cluster.kubeconfig, "-n", self.namespace, *args, input=input, check=check)

    def apply(self, document: dict[str, Any] | str, *, check: bool = True) -> Any:
        text = document if isinstance(document, str) else yaml.safe_dump(document)
        return self("apply", "--validate=false", "-f", "-", input=text, check=check)

    def get(self, kind: str, name: str) -> dict[str, Any] | None:
        result = self("get", kind, name, "-o", "json", check=False)
        if result.returncode != 0:
            return None
        import json

        return json.loads(result.stdout)

    def wait_for_object(self, kind: str, name: str, *, timeout: float = 60) -> dict[str, Any]:
        return wait_for(lambda: self.get(kind, name), timeout=timeout, what=f"{kind}/{name}")


@pytest.fixture
def ns(cluster: EmulatedCluster) -> str:
    name = f"t{next(_COUNTER)}"
    cluster.create_namespace(name)
    return name


@pytest.fixture
def k(cluster: EmulatedCluster, ns: str) -> Kubectl:
    return Kubectl(cluster, ns)
