"""Fixtures: the real control plane (one per run), a stand-in node, fake coordinators, and the real
operator per module under the ClusterRole of rbac.RULES; a namespace per test.

The stand-in node is a node agent whose containers all run ``sleep infinity``: the pods of the
operator's StatefulSets are created by the real StatefulSet controller, bound by the real scheduler
and reported Running and Ready by the agent, and nothing of rlkube runs in them (the coordinators
are faked; tests/kubernetes and tests/box run the real pods). Killing a pod's process is a crash.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml
from rlkube.launch.processes import RestartBackOff
from rlkube_devcluster.controlplane.cluster import AUDITED_GROUP
from rlkube_devcluster.coordinators import FakeCoordinators
from rlkube_devcluster.kubelet.node_agent import NodeAgent, NodeCapacity
from rlkube_devcluster.operator_process import OperatorProcess
from rlkube_devcluster.waiting import wait_for

from tests.conftest import delete_namespace
from tests.operator.harness import Watch, kubectl

if TYPE_CHECKING:
    from rlkube_devcluster.controlplane.cluster import ControlPlane

_COUNTER = itertools.count()
#: The group the tests' operators authenticate in; bound to the ClusterRole of rbac.RULES.
OPERATORS_GROUP = "rlkube:operators"
STAND_IN_NODE = "stand-in-0"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("op")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def operator_role(control_plane: ControlPlane, rljob_crd: None) -> str:
    """The ClusterRole of rbac.RULES, bound to :data:`OPERATORS_GROUP`."""
    from rlkube_operator.rbac import RULES

    name = "rlkube-operator-tests"
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": name},
        "rules": [rule.as_manifest() for rule in RULES],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": OPERATORS_GROUP}],
    }
    documents = yaml.safe_dump_all([role, binding])
    kubectl(control_plane.kubeconfig, "apply", "-f", "-", input=documents)
    return name


def operator_kubeconfig(control_plane: ControlPlane, user: str) -> Path:
    """A client certificate for ``user``, an operator: RBAC grants it rbac.RULES, the audit log records it."""
    return control_plane.kubeconfig_for(user, groups=(OPERATORS_GROUP, AUDITED_GROUP))


@pytest.fixture(scope="session")
def stand_in_node(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[NodeAgent]:
    kubeconfig = control_plane.kubeconfig_for(f"system:node:{STAND_IN_NODE}", groups=("system:nodes",))
    agent = NodeAgent(
        kubeconfig,
        STAND_IN_NODE,
        tmp_path_factory.mktemp("stand-in"),
        capacity=NodeCapacity(cpu="256", memory="1Ti", pods=1000, gpus=64),
        api_port=control_plane.port,
        backoff=RestartBackOff(initial=0.5, cap=2.0),
        max_grace=5.0,
        stand_in=("sleep", "infinity"),
    ).start()
    yield agent
    agent.stop()


@pytest.fixture(scope="module")
def coordinators() -> Iterator[FakeCoordinators]:
    sockets = Path(tempfile.mkdtemp(prefix="rlk"))  # unix socket paths must stay short
    fakes = FakeCoordinators(sockets)
    yield fakes
    fakes.stop()
    shutil.rmtree(sockets, ignore_errors=True)


def start_operator(
    control_plane: ControlPlane,
    coordinators: FakeCoordinators,
    workdir: Path,
    user: str,
    env: dict[str, str] | None = None,
) -> OperatorProcess:
    return OperatorProcess(
        operator_kubeconfig(control_plane, user),
        socket_dir=coordinators.socket_dir,
        log=workdir / f"{user}.log",
        env=env,
    ).start()


@pytest.fixture(scope="module")
def operator_user(request: pytest.FixtureRequest) -> str:
    """The operator's user name: one per module, so the audit log tells this module's requests apart."""
    return "rlkube-operator-" + request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_").replace(
        "_", "-"
    )


@pytest.fixture(scope="module")
def operator(
    control_plane: ControlPlane,
    operator_role: str,
    stand_in_node: NodeAgent,
    coordinators: FakeCoordinators,
    workdir: Path,
    operator_user: str,
) -> Iterator[OperatorProcess]:
    process = start_operator(control_plane, coordinators, workdir, operator_user)
    yield process
    process.stop()


class Kubectl:
    """kubectl as cluster-admin against the real API server, in one namespace."""

    def __init__(self, plane: ControlPlane, namespace: str) -> None:
        self.plane = plane
        self.namespace = namespace

    def __call__(self, *args: str, input: str | None = None, check: bool = True) -> Any:
        return kubectl(self.plane.kubeconfig, "-n", self.namespace, *args, input=input, check=check)

    def apply(self, document: dict[str, Any] | str, *, check: bool = True) -> Any:
        text = document if isinstance(document, str) else yaml.safe_dump(document)
        return self("apply", "-f", "-", input=text, check=check)

    def get(self, kind: str, name: str) -> dict[str, Any] | None:
        result = self("get", kind, name, "-o", "json", check=False)
        if result.returncode != 0:
            return None
        return dict(json.loads(result.stdout))

    def wait_for_object(self, kind: str, name: str, *, timeout: float = 60) -> dict[str, Any]:
        return wait_for(lambda: self.get(kind, name), timeout=timeout, what=f"{kind}/{name}")


def new_namespace(plane: ControlPlane, name: str) -> None:
    """Create ``name`` and wait for its ``default`` ServiceAccount (pods are admitted only then)."""
    kubectl(plane.kubeconfig, "create", "namespace", name)
    wait_for(
        lambda: kubectl(plane.kubeconfig, "-n", name, "get", "sa", "default", check=False).returncode == 0,
        what=f"the default ServiceAccount of {name}",
    )


@pytest.fixture
def ns(control_plane: ControlPlane) -> Iterator[str]:
    """A namespace of the test's own, deleted after it (waited for at the end of the module)."""
    name = f"op{next(_COUNTER)}"
    new_namespace(control_plane, name)
    yield name
    delete_namespace(control_plane.kubeconfig, name)


@pytest.fixture
def k(control_plane: ControlPlane, rljob_crd: None, ns: str) -> Kubectl:
    return Kubectl(control_plane, ns)


def running_pid(k: Kubectl, pod: str, *, restarts: int) -> int:
    """The pid of ``pod``'s container once it runs after ``restarts`` restarts (the agent's ``process://``)."""

    def pid() -> int | None:
        found = k.get("pod", pod)
        status = ((found or {}).get("status", {}).get("containerStatuses") or [{}])[0]
        if status.get("restartCount") == restarts and status.get("state", {}).get("running"):
            return int(status["containerID"].removeprefix("process://"))
        return None

    return wait_for(pid, timeout=120, what=f"pod {pod} running after {restarts} restarts")


def crash(k: Kubectl, pod: str, *, restarts: int) -> None:
    """SIGKILL the container of ``pod`` (which has restarted ``restarts`` times): it exits 137."""
    os.kill(running_pid(k, pod, restarts=restarts), signal.SIGKILL)


@pytest.fixture
def watch() -> Iterator[Any]:
    """``watch(k, kind, name)`` starts a :class:`~tests.operator.harness.Watch`; all stop after the test."""
    started: list[Watch] = []

    def start(k: Kubectl, kind: str, name: str | None = None) -> Watch:
        started.append(Watch(k.plane.kubeconfig, k.namespace, kind, name))
        return started[-1]

    yield start
    for one in started:
        one.stop()
