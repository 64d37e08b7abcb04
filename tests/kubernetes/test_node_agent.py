"""The node agent on the real control plane: a Node the real scheduler binds pods to, run as processes.

The agent acts as ``system:node:<name>`` (a kubelet's rights: the Node authorizer and
NodeRestriction). Its Node is tainted so that only these tests' pods (which tolerate the taint)
land on it, never the pods of other tests' Deployments.
"""

from __future__ import annotations

import json
import os
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from rlkube.launch.processes import RestartBackOff
from rlkube_devcluster.kubelet.node_agent import NodeAgent, NodeCapacity
from rlkube_devcluster.waiting import wait_for

from tests.kubernetes.conftest import Kube

if TYPE_CHECKING:
    from rlkube_devcluster.controlplane.cluster import ControlPlane

NODE = "agent-0"
TAINT = {"key": "rlkube.io/node-agent-test", "value": NODE, "effect": "NoSchedule"}


@pytest.fixture(scope="module")
def agent(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeAgent]:
    kubeconfig = control_plane.kubeconfig_for(f"system:node:{NODE}", groups=("system:nodes",))
    running = NodeAgent(
        kubeconfig,
        NODE,
        tmp_path_factory.mktemp("agent"),
        capacity=NodeCapacity(cpu="8", memory="16Gi", pods=20, gpus=2),
        api_port=control_plane.port,
        taints=[TAINT],
        backoff=RestartBackOff(initial=0.5, cap=2.0),
        max_grace=10.0,
    ).start()
    yield running
    running.stop()


def pod(name: str, script: str, *, restart: str = "Never", **extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": restart,
            "tolerations": [{**TAINT, "operator": "Equal"}],
            # Only on this node: the control plane's other nodes (tests/operator's stand-in) run nothing.
            "nodeSelector": {"kubernetes.io/hostname": NODE},
            "containers": [
                {
                    "name": "main",
                    "image": "python",
                    "command": ["python", "-c", textwrap.dedent(script)],
                    **extra,
                }
            ],
        },
    }


def with_default_account(kube: Kube) -> Kube:
    """Pods are admitted once the namespace's ``default`` ServiceAccount exists (a controller makes it)."""
    wait_for(lambda: kube.get("serviceaccount", "default"), what="the default ServiceAccount")
    return kube


def wait_for_phase(kube: Kube, name: str, phases: tuple[str, ...]) -> dict[str, Any]:
    return wait_for(
        lambda: (p := kube.get("pod", name)) and p.get("status", {}).get("phase") in phases and p,
        timeout=120,
        what=f"pod {name} to reach {phases}",
    )


def test_the_node_registers_ready_with_its_capacity_and_keeps_a_lease(
    agent: NodeAgent, control_plane: ControlPlane, kube: Kube
) -> None:
    node = kube.get("node", NODE)
    assert node is not None
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "2"
    assert node["status"]["capacity"]["cpu"] == "8"
    ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True"
    lease = json.loads(kube("get", "lease", "-n", "kube-node-lease", NODE, "-o", "json").stdout)
    assert lease["spec"]["holderIdentity"] == NODE


def test_a_bound_pod_runs_and_reports_its_exit_code_and_termination_message(
    agent: NodeAgent, kube: Kube
) -> None:
    script = """
        import os, sys
        with open(os.environ["RLKUBE_TERMINATION_MESSAGE_PATH"], "w") as f:
            f.write("gave up: " + os.environ["KUBERNETES_SERVICE_HOST"])
        sys.exit(3)
    """
    assert with_default_account(kube).apply(pod("exits", script)).returncode == 0
    done = wait_for_phase(kube, "exits", ("Failed", "Succeeded"))
    assert done["spec"]["nodeName"] == NODE  # bound by the real scheduler
    assert done["status"]["phase"] == "Failed"
    assert done["status"]["podIP"] == "127.0.0.1"
    terminated = done["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 3
    assert terminated["message"] == "gave up: 127.0.0.1"


def test_a_pod_reaches_the_api_server_with_its_projected_service_account_token(
    agent: NodeAgent, kube: Kube
) -> None:
    script = """
        import json, os, ssl, urllib.request
        token = open(os.environ["TOKEN"]).read()
        context = ssl.create_default_context(cafile=os.environ["CA"])
        url = "https://{}:{}/apis/authentication.k8s.io/v1/selfsubjectreviews".format(
            os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"])
        body = json.dumps({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}).encode()
        request = urllib.request.Request(url, data=body, method="POST", headers={
            "Authorization": "Bearer " + token, "Content-Type": "application/json"})
        with urllib.request.urlopen(request, context=context) as answer:
            user = json.loads(answer.read())["status"]["userInfo"]["username"]
        namespace = open(os.environ["NAMESPACE_FILE"]).read()
        with open(os.environ["RLKUBE_TERMINATION_MESSAGE_PATH"], "w") as f:
            f.write(user + " in " + namespace)
    """
    mounted = "/var/run/secrets/kubernetes.io/serviceaccount"
    env = [
        {"name": "TOKEN", "value": f"{mounted}/token"},
        {"name": "CA", "value": f"{mounted}/ca.crt"},
        {"name": "NAMESPACE_FILE", "value": f"{mounted}/namespace"},
    ]
    assert with_default_account(kube).apply(pod("whoami", script, env=env)).returncode == 0
    done = wait_for_phase(kube, "whoami", ("Failed", "Succeeded"))
    terminated = done["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 0, terminated
    assert terminated["message"] == f"system:serviceaccount:{kube.namespace}:default in {kube.namespace}"


@pytest.mark.skipif(os.geteuid() != 0, reason="the mount namespace of a container needs root")
def test_an_in_cluster_client_finds_the_token_where_kubernetes_mounts_it(
    agent: NodeAgent, kube: Kube
) -> None:
    # The kubernetes client's in-cluster config reads /var/run/secrets/kubernetes.io/serviceaccount
    # itself (the operator's pod does): no env points it anywhere.
    script = """
        import os
        from kubernetes import client, config
        config.load_incluster_config()
        review = client.AuthenticationV1Api().create_self_subject_review(
            client.V1SelfSubjectReview(api_version="authentication.k8s.io/v1", kind="SelfSubjectReview"))
        with open(os.environ["RLKUBE_TERMINATION_MESSAGE_PATH"], "w") as f:
            f.write(review.status.user_info.username)
    """
    assert with_default_account(kube).apply(pod("incluster", script)).returncode == 0
    done = wait_for_phase(kube, "incluster", ("Failed", "Succeeded"))
    terminated = done["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 0, terminated
    assert terminated["message"] == f"system:serviceaccount:{kube.namespace}:default"


def test_a_crashing_container_is_restarted_per_its_restart_policy(agent: NodeAgent, kube: Kube) -> None:
    assert (
        with_default_account(kube).apply(pod("crashes", "raise SystemExit(1)", restart="Always")).returncode
        == 0
    )
    restarted = wait_for(
        lambda: (
            (p := kube.get("pod", "crashes"))
            and (p.get("status", {}).get("containerStatuses") or [{}])[0].get("restartCount", 0) >= 2
            and p
        ),
        timeout=120,
        what="two restarts",
    )
    status = restarted["status"]["containerStatuses"][0]
    assert status["lastState"]["terminated"]["exitCode"] == 1
    assert restarted["status"]["phase"] == "Running"


def test_a_deleted_pod_is_stopped_and_then_removed_by_the_agent(
    agent: NodeAgent, kube: Kube, tmp_path: Path
) -> None:
    script = """
        import signal, sys, time
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        time.sleep(600)
    """
    assert with_default_account(kube).apply(pod("sleeper", script, restart="Always")).returncode == 0
    running = wait_for_phase(kube, "sleeper", ("Running",))
    assert running["status"]["containerStatuses"][0]["state"].get("running")
    kube("delete", "pod", "sleeper", "--wait=false")
    wait_for(lambda: kube.get("pod", "sleeper") is None, timeout=60, what="the pod to be removed")
    assert all(run.name != "sleeper" for run in agent.runs.values())
