"""End to end on the real control plane: kubectl applies a CartPole RLJob, the operator renders its
StatefulSets, the real StatefulSet controller creates the pods, the real scheduler binds them to the
node agents' Nodes, the agents run them (``rlkube pod``), and training reaches ``Complete``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rlkube.launch.processes import RestartBackOff
from rlkube_devcluster.operator_process import OperatorProcess
from rlkube_devcluster.real_cluster import RealCluster
from rlkube_devcluster.waiting import wait_for

from tests.operator.harness import kubectl

pytestmark = pytest.mark.slow

NAME = "cartpole-k8s"
NAMESPACE = "team"
JOB: dict[str, Any] = {
    "apiVersion": "rlkube.io/v1alpha1",
    "kind": "RLJob",
    "metadata": {"name": NAME, "namespace": NAMESPACE},
    "spec": {
        "engine": "sync",
        "policy": {"type": "PPO", "modelCfg": {"hiddenSizes": [16]}, "algoCfg": {"updateEpochs": 1}},
        "env": {"id": "CartPole-v1", "numEnvs": 2},
        "train": {
            "maxEpochs": 3,
            "stepsPerEpoch": 128,
            "fragmentLength": 16,
            "batchSize": 64,
            "evalInterval": 0,
            "saveInterval": 0,
        },
        "trainer": {"replicas": 1},
        "evaluator": {"replicas": 1},
        "log": {"intervalSeconds": 1},
    },
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealCluster]:
    # A control plane of its own: its Nodes must attract only this module's pods.
    started = RealCluster(
        tmp_path_factory.mktemp("real"), nodes=2, backoff=RestartBackOff(initial=0.5, cap=2.0)
    ).start()
    yield started
    started.stop()


@pytest.fixture(scope="module")
def operator(cluster: RealCluster) -> Iterator[OperatorProcess]:
    process = OperatorProcess(
        cluster.kubeconfig,
        socket_dir=cluster.socket_dir,
        log=cluster.workdir / "operator.log",
        env={"RLKUBE_STATUS_INTERVAL": "1", "RLKUBE_COORDINATOR_TIMEOUT": "2"},
    ).start()
    yield process
    process.stop()


def get(cluster: RealCluster, *args: str) -> dict[str, Any]:
    return dict(json.loads(kubectl(cluster.kubeconfig, "-n", NAMESPACE, "get", *args, "-o", "json").stdout))


def test_an_rljob_applied_with_kubectl_trains_to_complete_on_pods_the_node_agents_run(
    cluster: RealCluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    kubectl(cluster.kubeconfig, "create", "namespace", NAMESPACE)
    wait_for(
        lambda: (
            kubectl(cluster.kubeconfig, "-n", NAMESPACE, "get", "sa", "default", check=False).returncode == 0
        )
    )
    manifest = tmp_path / "job.json"
    manifest.write_text(json.dumps(JOB))
    kubectl(cluster.kubeconfig, "apply", "-f", str(manifest))

    def phase() -> str:
        return str(get(cluster, "rlj", NAME).get("status", {}).get("phase", ""))

    wait_for(
        lambda: phase() == "Running",
        timeout=300,
        interval=1,
        what=f"the job to run; operator log {operator.log_path}",
    )
    pods = get(cluster, "pods", "-l", f"rlkube.io/job-name={NAME}")["items"]
    assert {p["spec"]["nodeName"] for p in pods} <= {"node-0", "node-1"}  # bound by kube-scheduler
    assert all(p["status"]["phase"] == "Running" for p in pods)
    wait_for(
        lambda: phase() in ("Complete", "Failed"),
        timeout=600,
        interval=1,
        what=f"the job to finish; operator log {operator.log_path}",
    )
    job = get(cluster, "rlj", NAME)
    assert job["status"]["phase"] == "Complete", job["status"]
    assert job["status"]["progress"]["epoch"] == 3
