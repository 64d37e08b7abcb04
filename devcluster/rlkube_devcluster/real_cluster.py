"""The dev cluster on the real control plane: Kubernetes itself, the RLJob CRD, and node agents.

:class:`RealCluster` starts :class:`~.controlplane.cluster.ControlPlane` (etcd, kube-apiserver,
kube-controller-manager, kube-scheduler), installs crds/rljob.yaml, and registers ``nodes`` node
agents (:class:`~.kubelet.node_agent.NodeAgent`, each acting as ``system:node:<name>``) that run
the pods the scheduler binds to them as local processes (or, with ``stand_in``, that command in
place of every container: pods Running and Ready, nothing of theirs run). The agents share one
:class:`~.kubelet.network_thread.NetworkThread`, whose per-job unix sockets are where the operator
(run beside it, :class:`~.operator_process.OperatorProcess`) reaches each coordinator.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from rlkube.launch.processes import RestartBackOff

from rlkube_devcluster import REPO
from rlkube_devcluster.controlplane.cluster import ControlPlane
from rlkube_devcluster.kubelet.api_client import ApiError, KubeApi
from rlkube_devcluster.kubelet.network_thread import NetworkThread
from rlkube_devcluster.kubelet.node_agent import NodeAgent, NodeCapacity
from rlkube_devcluster.kueue.manager import KueueManager
from rlkube_devcluster.waiting import wait_for

CRD = REPO / "crds" / "rljob.yaml"


class RealCluster:
    def __init__(
        self,
        workdir: Path,
        *,
        nodes: int = 2,
        capacity: NodeCapacity = NodeCapacity(cpu="16", memory="64Gi"),
        backoff: RestartBackOff = RestartBackOff(),
        socket_dir: Path | None = None,
        max_grace: float = 30.0,
        stand_in: Sequence[str] | None = None,
        kueue: bool = False,
    ) -> None:
        self.workdir = workdir
        self.stand_in = stand_in
        self.max_grace = max_grace
        self.node_count = max(1, nodes)
        self.capacity = capacity
        self.backoff = backoff
        # unix socket paths must stay short (108 bytes): a directory of their own under /tmp
        self._own_sockets = socket_dir is None
        self.socket_dir = socket_dir or Path(tempfile.mkdtemp(prefix="rlk"))
        # The nodes' memory is memory: under /dev/shm where there is one.
        shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
        self.shm_root = Path(tempfile.mkdtemp(prefix="rlkube-nodes-", dir=shm))
        self.plane = ControlPlane(workdir / "controlplane")
        #: Kueue's manager beside the control plane (``kueue=True``; :mod:`.kueue.manager`).
        self.kueue = KueueManager(self.plane, workdir / "kueue") if kueue else None
        self.networks: NetworkThread | None = None
        self.agents: list[NodeAgent] = []

    @property
    def kubeconfig(self) -> Path:
        """cluster-admin's kubeconfig (for kubectl and the operator)."""
        return self.plane.kubeconfig

    def start(self) -> RealCluster:
        try:
            self.plane.start()
            self._install_crd()
            if self.kueue is not None:
                self.kueue.start()
            self.networks = NetworkThread(self.socket_dir)
            for index in range(self.node_count):
                name = f"node-{index}"
                kubeconfig = self.plane.kubeconfig_for(f"system:node:{name}", groups=("system:nodes",))
                agent = NodeAgent(
                    kubeconfig,
                    name,
                    self.workdir / "nodes" / name,
                    capacity=self.capacity,
                    api_port=self.plane.port,
                    backoff=self.backoff,
                    networks=self.networks,
                    memory=self.shm_root / name,
                    claims=self.workdir / "claims",  # claim() names the same directories
                    max_grace=self.max_grace,
                    stand_in=self.stand_in,
                )
                self.agents.append(agent.start())
        except BaseException:
            self.stop()
            raise
        return self

    def claim(self, namespace: str, name: str) -> Path:
        """The directory in which the node agents keep PersistentVolumeClaim ``name``'s files."""
        return self.workdir / "claims" / namespace / name

    def coordinator_target(self, namespace: str, job: str) -> str:
        assert self.networks is not None, "the cluster is not started"
        return self.networks.coordinator_target(namespace, job)

    def coordinator_socket(self, namespace: str, job: str) -> Path:
        assert self.networks is not None, "the cluster is not started"
        return self.networks.coordinator_socket(namespace, job)

    def processes(self) -> dict[tuple[str, str], dict[str, Any]]:
        """(namespace, pod) -> pid, restarts, node, terminating: what the node agents run now."""
        found: dict[tuple[str, str], dict[str, Any]] = {}
        for agent in self.agents:
            found.update(agent.processes())
        return found

    def stop(self) -> None:
        while self.agents:
            self.agents.pop().stop()
        if self.networks is not None:
            self.networks.close()
            self.networks = None
        if self.kueue is not None:
            self.kueue.stop()
        self.plane.stop()
        shutil.rmtree(self.shm_root, ignore_errors=True)
        if self._own_sockets:
            shutil.rmtree(self.socket_dir, ignore_errors=True)

    def _install_crd(self) -> None:
        api = KubeApi(self.plane.kubeconfig)
        crd = yaml.safe_load(CRD.read_text())
        path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
        try:
            api.create(path, crd)
        except ApiError as exc:
            if exc.status != 409:
                raise

        def established() -> bool:
            conditions = (api.get(f"{path}/{crd['metadata']['name']}").get("status") or {}).get("conditions")
            return any(c["type"] == "Established" and c["status"] == "True" for c in conditions or [])

        wait_for(established, what="the RLJob CRD to be Established")
