"""The real kubectl and the real kopf operator against a real kube-apiserver: what a user does, end to end.

The operator authenticates as a user bound to the ClusterRole of rbac.RULES, so RBAC refuses
anything else; its pods are run by the stand-in node (tests/operator/conftest.py). Each test gets
its own namespace; the control plane is shared by the run, the operator by the module. Every
wait polls with a generous deadline (the machine may be loaded); latencies are measured by
tests/operator/measure.py, not asserted here.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

from rlkube import contract as c
from rlkube._proto import policy_group_pb2 as pb
from rlkube.contract import Role
from rlkube_devcluster.coordinators import FakeCoordinators
from rlkube_devcluster.operator_process import OperatorProcess
from rlkube_devcluster.waiting import wait_for

from tests.operator.conftest import Kubectl, crash
from tests.operator.harness import ROOT
from tests.operator.manifests import job_document

if TYPE_CHECKING:
    from rlkube_devcluster.controlplane.cluster import ControlPlane

CHILDREN = [
    ("configmap", "{}-job"),
    ("service", "{}-train"),
    ("service", "{}-coordinator"),
    ("service", "{}-eval"),
    ("poddisruptionbudget", "{}-train"),
    ("statefulset", "{}-train"),
    ("statefulset", "{}-eval"),
]


def condition(job: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((x for x in job.get("status", {}).get("conditions", []) if x["type"] == kind), {})


def env_names(sts: dict[str, Any]) -> list[str]:
    return [e["name"] for e in sts["spec"]["template"]["spec"]["containers"][0]["env"]]


def pod_uids(k: Kubectl, selector: str) -> dict[str, str]:
    pods = json.loads(k("get", "pods", "-l", selector, "-o", "json").stdout)["items"]
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods}


def test_apply_example_creates_owned_children_with_the_env_contract(
    k: Kubectl, operator: OperatorProcess
) -> None:
    k("apply", "-f", str(ROOT / "examples" / "rljob.yaml"))
    job = k.wait_for_object("rlj", "cartpole-ppo")
    for kind, pattern in CHILDREN:
        child = k.wait_for_object(kind, pattern.format("cartpole-ppo"))
        owners = child["metadata"]["ownerReferences"]
        assert owners == [
            {
                "apiVersion": "rlkube.io/v1alpha1",
                "kind": "RLJob",
                "name": "cartpole-ppo",
                "uid": job["metadata"]["uid"],
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ], kind
    train = k.get("statefulset", "cartpole-ppo-train")
    evals = k.get("statefulset", "cartpole-ppo-eval")
    assert train is not None
    assert evals is not None
    assert env_names(train) == list(c.contract_names(Role.TRAIN))
    assert env_names(evals) == list(c.contract_names(Role.EVAL))
    assert (train["spec"]["replicas"], evals["spec"]["replicas"]) == (2, 4)
    assert train["spec"]["podManagementPolicy"] == "Parallel"
    # The StatefulSet controller gives each pod its index label, which the downward API turns into RANK.
    pod = k.wait_for_object("pod", "cartpole-ppo-train-1")
    assert pod["metadata"]["labels"][c.LABEL_POD_INDEX] == "1"


def test_scale_changes_only_the_eval_statefulset(
    k: Kubectl, operator: OperatorProcess, coordinators: FakeCoordinators
) -> None:
    coordinators.report(k.namespace, "scaled", phase="Running", epoch=2, max_epochs=50, weight_version=2)
    k.apply(job_document("scaled", trainer={"replicas": 2}, evaluator={"replicas": 1}))
    wait_for(lambda: (k.get("statefulset", "scaled-train") or {}).get("status", {}).get("readyReplicas") == 2)
    wait_for(lambda: (k.get("rlj", "scaled") or {}).get("status", {}).get("phase") == "Running")
    train_before = k.get("statefulset", "scaled-train")
    pods_before = pod_uids(k, f"{c.LABEL_JOB}=scaled,{c.LABEL_ROLE}=train")

    k("scale", "rlj/scaled", "--replicas=5")

    wait_for(lambda: (k.get("statefulset", "scaled-eval") or {}).get("spec", {}).get("replicas") == 5)
    wait_for(lambda: (k.get("rlj", "scaled") or {}).get("status", {}).get("eval", {}).get("ready") == "5/5")
    train_after = k.get("statefulset", "scaled-train")
    assert train_after is not None
    assert train_before is not None
    assert train_after["spec"] == train_before["spec"]
    assert train_after["metadata"]["generation"] == train_before["metadata"]["generation"]
    assert pod_uids(k, f"{c.LABEL_JOB}=scaled,{c.LABEL_ROLE}=train") == pods_before
    config = k.get("configmap", "scaled-job")
    assert config is not None
    assert "replicas: 5" not in config["data"]["job.yaml"]
    scale = json.loads(
        k("get", "--raw", f"/apis/rlkube.io/v1alpha1/namespaces/{k.namespace}/rljobs/scaled/scale").stdout
    )
    assert scale["spec"]["replicas"] == 5
    assert scale["status"]["selector"] == f"{c.LABEL_JOB}=scaled,{c.LABEL_ROLE}=eval"


def test_get_rlj_shows_phase_readiness_and_progress_columns(
    k: Kubectl, operator: OperatorProcess, coordinators: FakeCoordinators
) -> None:
    coordinators.report(
        k.namespace,
        "columns",
        phase="Running",
        epoch=7,
        max_epochs=50,
        weight_version=7,
        last_return=98.5,
        episodes=30,
        nodes=[
            pb.NodeWeights(node_name="node-a", version=7, lag=0, workers=1),
            pb.NodeWeights(node_name="node-b", version=6, lag=1, workers=1),
        ],
    )
    k.apply(job_document("columns"))

    def shown() -> bool:
        status = (k.get("rlj", "columns") or {}).get("status", {})
        pods_ready = status.get("train", {}).get("ready") == status.get("eval", {}).get("ready") == "1/1"
        return pods_ready and status.get("progress", {}).get("epoch") == 7

    wait_for(shown, what="epoch 7 with every pod ready")
    lines = k("get", "rlj").stdout.splitlines()
    assert lines[0].split() == [
        "NAME",
        "PHASE",
        "TRAIN",
        "EVAL",
        "EPOCH",
        "PUBLISHED",
        "LOADED",
        "RETURN",
        "AGE",
    ]
    row = lines[1].split()
    assert row[:8] == ["columns", "Running", "1/1", "1/1", "7", "7", "6", "98.5"]  # loaded: min over nodes
    assert "columns" in k("get", "rlkube").stdout  # the category


def test_wait_for_complete_returns_when_the_job_ends(
    k: Kubectl, operator: OperatorProcess, coordinators: FakeCoordinators
) -> None:
    coordinators.report(k.namespace, "ends", phase="Running", epoch=1, max_epochs=3, weight_version=1)
    k.apply(job_document("ends"))
    wait_for(lambda: (k.get("rlj", "ends") or {}).get("status", {}).get("phase") == "Running")
    coordinators.report(
        k.namespace,
        "ends",
        phase="Complete",
        finished=True,
        epoch=3,
        max_epochs=3,
        weight_version=3,
        last_return=500.0,
        episodes=60,
        env_steps=12288,
    )
    result = k("wait", "--for=condition=Complete", "rlj/ends", "--timeout=120s")
    assert "condition met" in result.stdout
    job = k.get("rlj", "ends")
    assert job is not None
    assert condition(job, "Complete")["reason"] == "TrainingFinished"
    # cleanPodPolicy All: both StatefulSets at zero, the final figures still in status.
    wait_for(lambda: (k.get("statefulset", "ends-train") or {}).get("spec", {}).get("replicas") == 0)
    wait_for(lambda: (k.get("statefulset", "ends-eval") or {}).get("spec", {}).get("replicas") == 0)
    wait_for(lambda: not pod_uids(k, f"{c.LABEL_JOB}=ends"))
    final = k.get("rlj", "ends")
    assert final is not None
    assert final["status"]["progress"]["epoch"] == 3
    assert final["status"]["progress"]["envSteps"] == 12288
    assert final["status"]["phase"] == "Complete"


def test_delete_collects_every_child(k: Kubectl, operator: OperatorProcess) -> None:
    k.apply(job_document("doomed"))
    for kind, pattern in CHILDREN:
        k.wait_for_object(kind, pattern.format("doomed"))
    wait_for(lambda: pod_uids(k, f"{c.LABEL_JOB}=doomed"))
    k("delete", "rlj", "doomed", "--timeout=60s")
    for kind, pattern in CHILDREN:
        wait_for(lambda kind=kind, pattern=pattern: k.get(kind, pattern.format("doomed")) is None)
    wait_for(lambda: not pod_uids(k, f"{c.LABEL_JOB}=doomed"))


def test_suspend_scales_to_zero_and_resume_restores(k: Kubectl, operator: OperatorProcess) -> None:
    k.apply(job_document("nap", trainer={"replicas": 2}, evaluator={"replicas": 3}))
    wait_for(lambda: (k.get("statefulset", "nap-eval") or {}).get("status", {}).get("readyReplicas") == 3)
    k("patch", "rlj", "nap", "--type=merge", "-p", '{"spec":{"runPolicy":{"suspend":true}}}')
    wait_for(lambda: (k.get("statefulset", "nap-train") or {}).get("spec", {}).get("replicas") == 0)
    wait_for(lambda: (k.get("statefulset", "nap-eval") or {}).get("spec", {}).get("replicas") == 0)
    suspended = wait_for(lambda: (j := k.get("rlj", "nap")) and j["status"].get("phase") == "Suspended" and j)
    assert condition(suspended, "Suspended")["status"] == "True"
    wait_for(lambda: not pod_uids(k, f"{c.LABEL_JOB}=nap"))

    k("patch", "rlj", "nap", "--type=merge", "-p", '{"spec":{"runPolicy":{"suspend":false}}}')
    wait_for(lambda: (k.get("statefulset", "nap-train") or {}).get("spec", {}).get("replicas") == 2)
    wait_for(lambda: (k.get("statefulset", "nap-eval") or {}).get("spec", {}).get("replicas") == 3)
    resumed = wait_for(
        lambda: (j := k.get("rlj", "nap")) and condition(j, "Suspended").get("reason") == "JobResumed" and j
    )
    assert condition(resumed, "Suspended")["status"] == "False"
    events = k("get", "events", "--field-selector", "involvedObject.name=nap", "-o", "json").stdout
    reasons = {e["reason"] for e in json.loads(events)["items"]}
    assert {"JobSuspended", "JobResumed"} <= reasons


def test_train_restarts_beyond_the_backoff_limit_fail_the_job(
    k: Kubectl, operator: OperatorProcess, coordinators: FakeCoordinators
) -> None:
    coordinators.report(k.namespace, "flaky", phase="Running", epoch=1, max_epochs=9)
    k.apply(job_document("flaky", runPolicy={"backoffLimit": 1}))
    wait_for(lambda: (k.get("rlj", "flaky") or {}).get("status", {}).get("phase") == "Running")
    crash(k, "flaky-train-0", restarts=0)
    wait_for(lambda: (k.get("rlj", "flaky") or {}).get("status", {}).get("train", {}).get("restarts") == 1)
    crash(k, "flaky-train-0", restarts=1)
    k("wait", "--for=condition=Failed", "rlj/flaky", "--timeout=120s")
    job = k.get("rlj", "flaky")
    assert job is not None
    failed = condition(job, "Failed")
    assert failed["reason"] == "BackoffLimitExceeded"
    assert "backoffLimit 1" in failed["message"]
    assert job["status"]["phase"] == "Failed"
    wait_for(lambda: (k.get("statefulset", "flaky-train") or {}).get("spec", {}).get("replicas") == 0)
    described = k("describe", "rlj", "flaky").stdout
    assert "BackoffLimitExceeded" in described


def test_active_deadline_fails_the_job(k: Kubectl, operator: OperatorProcess) -> None:
    k.apply(job_document("slow", runPolicy={"activeDeadlineSeconds": 1}))
    k("wait", "--for=condition=Failed", "rlj/slow", "--timeout=120s")
    assert condition(k.get("rlj", "slow") or {}, "Failed")["reason"] == "DeadlineExceeded"


def test_ttl_deletes_the_finished_job_and_its_children(
    k: Kubectl, operator: OperatorProcess, coordinators: FakeCoordinators
) -> None:
    coordinators.report(k.namespace, "brief", phase="Complete", finished=True, epoch=1, max_epochs=1)
    k.apply(job_document("brief", runPolicy={"ttlSecondsAfterFinished": 1}))
    k.wait_for_object("statefulset", "brief-train")
    wait_for(lambda: k.get("rlj", "brief") is None, timeout=120, what="the TTL deletion")
    wait_for(lambda: k.get("statefulset", "brief-train") is None)


def test_operator_serves_healthz_and_prometheus_metrics(operator: OperatorProcess) -> None:
    assert operator.healthy()
    text = operator.metrics()
    for name in (
        "rlkube_operator_reconciles_total",
        "rlkube_operator_reconcile_errors_total",
        "rlkube_operator_reconcile_duration_seconds_bucket",
        "rlkube_operator_jobs",
        "rlkube_operator_applies_total",
    ):
        assert name in text, name
    assert re.search(r'rlkube_operator_jobs\{phase="Running"\} \d', text)


#: Listed in rbac.RULES but not exercised here: server-side apply creates objects with PATCH (some
#: API servers and policy engines also check create), NetworkPolicies are off by default, and
#: kopf watches namespaces only for glob namespace patterns; PodGroups only for gang-scheduled jobs
#: (tests/scheduling renders them).
NOT_EXERCISED = {
    ("apps", "statefulsets", "create"),
    ("policy", "poddisruptionbudgets", "create"),
    ("scheduling.volcano.sh", "podgroups", "create"),
    ("scheduling.volcano.sh", "podgroups", "patch"),
    ("scheduling.x-k8s.io", "podgroups", "create"),
    ("scheduling.x-k8s.io", "podgroups", "patch"),
    ("", "services", "create"),
    ("", "configmaps", "create"),
    ("", "secrets", "create"),  # server-side apply creates it: audited as patch
    ("networking.k8s.io", "networkpolicies", "create"),
    ("networking.k8s.io", "networkpolicies", "patch"),
    ("", "namespaces", "list"),
    ("", "namespaces", "watch"),
    # Leader election: this module runs one standalone operator (tests/operator/test_leader_election.py).
    ("coordination.k8s.io", "leases", "get"),
    ("coordination.k8s.io", "leases", "create"),
    ("coordination.k8s.io", "leases", "update"),
    # kueueIntegration RLJob: exercised against the real Kueue in tests/kueue (this module runs none).
    *(
        ("kueue.x-k8s.io", "workloads", verb)
        for verb in ("get", "list", "watch", "create", "patch", "delete")
    ),
    ("kueue.x-k8s.io", "workloads/status", "patch"),
    ("kueue.x-k8s.io", "resourceflavors", "get"),
    ("scheduling.k8s.io", "priorityclasses", "get"),
}


def test_the_operator_used_exactly_the_verbs_listed_in_rbac(
    control_plane: ControlPlane, operator: OperatorProcess, operator_user: str
) -> None:
    """Runs last in this module: every request the operator made was allowed by RBAC (the ClusterRole
    of rbac.RULES), and every rule was needed (or is one of the few the tests cannot reach)."""
    from rlkube_operator.rbac import RULES

    allowed = {
        (g, r, v) for rule in RULES for g in rule.api_groups for r in rule.resources for v in rule.verbs
    }
    requests = [e for e in control_plane.audit() if e.user == operator_user]
    assert requests, "the audit log holds no request of the operator"
    refused = {(e.verb, e.group, e.resource, e.subresource) for e in requests if not e.allowed}
    assert not refused, f"RBAC refused the operator: {sorted(refused)}"
    used = {
        (e.group, f"{e.resource}/{e.subresource}" if e.subresource else e.resource, e.verb)
        for e in requests
        if e.resource
    }
    assert used <= allowed, sorted(used - allowed)
    assert allowed - used == NOT_EXERCISED, sorted(allowed - used)
