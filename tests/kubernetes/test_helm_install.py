"""Installed as users install it: ``helm install`` of charts/rlkube into the real API server, the
operator running as a pod of the chart's Deployment (run by a node agent, in-cluster config from
its projected ServiceAccount token), under the chart's ServiceAccount and RBAC; then an RLJob
applied with kubectl trains to ``Complete`` on pods the node agents run.

Every wait is kubectl's own watch (``kubectl wait``) with a generous deadline; a failed wait
reports the operator pod's status, events and log. The last test reads the API server's audit
log: any request of the operator refused by the chart's RBAC (a verb missing from its
ClusterRole) fails it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rlkube.launch.processes import free_port
from rlkube_devcluster.real_cluster import RealCluster
from rlkube_devcluster.waiting import wait_for

from tests.conftest import delete_namespace
from tests.delivery.chart import CHART, helm
from tests.operator.conftest import new_namespace
from tests.operator.harness import kubectl

pytestmark = pytest.mark.slow

RELEASE = "rlkube"
NAMESPACE = "rlkube-system"
OPERATOR = f"{RELEASE}-operator"  # the chart's Deployment and ServiceAccount
OPERATOR_USER = f"system:serviceaccount:{NAMESPACE}:{OPERATOR}"
JOBS = "team"
NAME = "cartpole-k8s"
JOB: dict[str, Any] = {
    "apiVersion": "rlkube.io/v1alpha1",
    "kind": "RLJob",
    "metadata": {"name": NAME, "namespace": JOBS},
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


def run_kubectl(cluster: RealCluster, *args: str, timeout: float = 120.0, check: bool = True) -> Any:
    return kubectl(cluster.kubeconfig, *args, timeout=timeout, check=check)


def operator_report(cluster: RealCluster) -> str:
    """The operator pod's status, its events and the end of its log; the job's namespace (the
    RLJob, its StatefulSets and pods, its events); the controller-manager's errors: what a failed
    wait shows, so that a stall says whose it was."""
    pods = json.loads(
        run_kubectl(cluster, "-n", NAMESPACE, "get", "pods", "-o", "json", check=False).stdout
        or '{"items":[]}'
    )["items"]
    lines = []
    for pod in pods:
        name = pod["metadata"]["name"]
        lines.append(f"--- pod {name} on {pod['spec'].get('nodeName')}: {json.dumps(pod.get('status'))}")
        logs = sorted(
            cluster.workdir.glob(f"nodes/*/logs/{NAMESPACE}_{name}_*/*.log"), key=lambda p: int(p.stem)
        )
        if logs:
            lines.append(f"--- its log ({logs[-1]}):\n{logs[-1].read_text(errors='replace')[-4000:]}")
    for namespace in (NAMESPACE, JOBS):
        events = run_kubectl(cluster, "-n", namespace, "get", "events", check=False).stdout
        lines.append(f"--- events in {namespace}:\n{events}")
    objects = run_kubectl(cluster, "-n", JOBS, "get", "rlj,sts,pods,svc", "-o", "wide", check=False)
    lines.append(f"--- in {JOBS}:\n{objects.stdout}{objects.stderr}")
    job = run_kubectl(cluster, "-n", JOBS, "get", "rlj", NAME, "-o", "jsonpath={.status}", check=False)
    lines.append(f"--- rlj/{NAME} status: {job.stdout}{job.stderr}")
    writes = sorted(
        {
            (e.verb, e.resource, e.subresource, e.code)
            for e in cluster.plane.audit()
            if e.user == OPERATOR_USER and e.namespace == JOBS and e.verb not in {"get", "list", "watch"}
        }
    )
    lines.append(f"--- the operator's writes in {JOBS} (verb, resource, subresource, code): {writes}")
    manager = cluster.plane.workdir / "logs" / "kube-controller-manager.log"
    if manager.exists():
        errors = [line for line in manager.read_text(errors="replace").splitlines() if line.startswith("E")]
        lines.append(
            f"--- kube-controller-manager errors (last 20 of {len(errors)}):\n" + "\n".join(errors[-20:])
        )
    return "\n".join(lines)


def wait(cluster: RealCluster, *args: str, timeout: int = 300) -> None:
    """``kubectl wait ARGS`` (a watch, not a poll); on failure, the operator's report."""
    result = run_kubectl(cluster, "wait", *args, f"--timeout={timeout}s", timeout=timeout + 30, check=False)
    if result.returncode != 0:
        raise AssertionError(
            f"kubectl wait {' '.join(args)} failed: {result.stderr}\n{operator_report(cluster)}"
        )


@pytest.fixture(scope="module")
def release(real_cluster: RealCluster) -> Iterator[RealCluster]:
    """The chart installed into the cluster-in-a-box (one operator pod), uninstalled after the module."""
    cluster = real_cluster
    address = f"unix://{cluster.socket_dir}/{{namespace}}.{{job}}.sock"
    extra_env = [
        # The box has no cluster DNS: the operator reaches each coordinator through the node
        # agents' proxy socket, as the operator process of the other tests does.
        {"name": "RLKUBE_COORDINATOR_ADDRESS", "value": address},
        {"name": "RLKUBE_STATUS_INTERVAL", "value": "1"},
        {"name": "RLKUBE_COORDINATOR_TIMEOUT", "value": "2"},
    ]
    helm(
        "install",
        RELEASE,
        str(CHART),
        "--kubeconfig",
        str(cluster.kubeconfig),
        "--namespace",
        NAMESPACE,
        "--create-namespace",
        # Every pod of the box shares this machine's network: one replica, on a free port.
        "--set",
        "operator.replicas=1",
        "--set",
        f"operator.metricsPort={free_port()}",
        "--set-json",
        f"operator.extraEnv={json.dumps(extra_env)}",
    )
    try:
        yield cluster
    finally:
        helm(
            "uninstall", RELEASE, "--kubeconfig", str(cluster.kubeconfig), "--namespace", NAMESPACE, "--wait"
        )
        run_kubectl(
            cluster, "-n", NAMESPACE, "wait", "--for=delete", "pods", "--all", "--timeout=120s", check=False
        )


def test_helm_install_runs_the_operator_as_a_pod_under_the_charts_service_account(
    release: RealCluster,
) -> None:
    wait(release, "-n", NAMESPACE, "--for=condition=Available", f"deployment/{OPERATOR}")
    pods = json.loads(
        run_kubectl(
            release, "-n", NAMESPACE, "get", "pods", "-l", "app.kubernetes.io/instance=rlkube", "-o", "json"
        ).stdout
    )["items"]
    assert len(pods) == 1, operator_report(release)
    (pod,) = pods
    assert pod["spec"]["serviceAccountName"] == OPERATOR
    assert pod["spec"]["nodeName"] in {"node-0", "node-1"}  # bound by kube-scheduler
    assert pod["status"]["phase"] == "Running"
    # The operator talks to the API server as its ServiceAccount (in-cluster config, projected token):
    # it watches RLJobs once kopf has started.
    try:
        wait_for(
            lambda: any(e.user == OPERATOR_USER and e.resource == "rljobs" for e in release.plane.audit()),
            timeout=300,
            interval=1,
            what=f"a request of {OPERATOR_USER} in the audit log",
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{operator_report(release)}") from None
    # It leads through the chart's Lease, which the chart's Role lets it hold in its namespace only.
    lease = json.loads(run_kubectl(release, "-n", NAMESPACE, "get", "lease", OPERATOR, "-o", "json").stdout)
    assert lease["spec"]["holderIdentity"].startswith(pod["metadata"]["name"] + "_"), lease["spec"]


def test_an_rljob_applied_with_kubectl_trains_to_complete_on_pods_the_node_agents_run(
    release: RealCluster, tmp_path: Path
) -> None:
    new_namespace(release.plane, JOBS)
    manifest = tmp_path / "job.json"
    manifest.write_text(json.dumps(JOB))
    run_kubectl(release, "apply", "-f", str(manifest))

    # The job is small enough to finish between two of the operator's status writes (phase Pending
    # to Complete), and its pods are removed then (cleanPodPolicy All): the scheduler's events say
    # where they ran.
    wait(release, "-n", JOBS, "--for=condition=Complete", f"rlj/{NAME}", timeout=600)
    job = json.loads(run_kubectl(release, "-n", JOBS, "get", "rlj", NAME, "-o", "json").stdout)
    assert job["status"]["phase"] == "Complete", job["status"]
    assert job["status"]["progress"]["epoch"] == 3
    assigned = {
        event["involvedObject"]["name"]: event["message"].rsplit(" to ", 1)[-1]
        for event in json.loads(
            run_kubectl(
                release, "-n", JOBS, "get", "events", "--field-selector", "reason=Scheduled", "-o", "json"
            ).stdout
        )["items"]
        if event["involvedObject"]["kind"] == "Pod"
    }
    assert set(assigned) == {f"{NAME}-train-0", f"{NAME}-eval-0"}, assigned
    assert set(assigned.values()) <= {"node-0", "node-1"}  # bound by kube-scheduler
    # The operator pod rendered the children: they are its (server-side apply's field manager).
    train = json.loads(
        run_kubectl(
            release, "-n", JOBS, "get", "sts", f"{NAME}-train", "-o", "json", "--show-managed-fields"
        ).stdout
    )
    creators = {entry["manager"] for entry in train["metadata"]["managedFields"]}
    assert creators, train["metadata"]
    delete_namespace(release.kubeconfig, JOBS)


def test_every_request_of_the_operator_pod_was_allowed_by_the_charts_rbac(release: RealCluster) -> None:
    """Runs last in this module: a verb missing from the chart's ClusterRole would be a request the
    audit log says RBAC forbade."""
    requests = [e for e in release.plane.audit() if e.user == OPERATOR_USER]
    assert requests
    refused = sorted(
        {(e.verb, e.group, e.resource, e.subresource, e.namespace) for e in requests if not e.allowed}
    )
    assert not refused, f"the chart's RBAC refused the operator: {refused}\n{operator_report(release)}"
    writes = {(e.verb, e.resource) for e in requests if e.verb in ("create", "patch", "update", "delete")}
    assert ("patch", "statefulsets") in writes  # it did the work, under that identity
