"""An RLJob with ``kueueIntegration: RLJob`` is one Kueue Workload, on the real control plane and a
real Kueue: queued until admitted, placed on the admitted flavour's nodes, gone with its job.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from rlkube_devcluster.waiting import wait_for

from tests.kueue.conftest import KueueCluster

pytestmark = pytest.mark.slow

#: What each job's pods ask for: one CPU per pod, two pods (one train rank, one eval worker).
POD_CPU = "1"


def queues(namespace: str, *, cpu: str, preemption: bool = False) -> list[dict[str, Any]]:
    """A ResourceFlavor on node-1 only, a ClusterQueue with ``cpu`` of quota, a LocalQueue."""
    flavor = f"{namespace}-node-1"
    cluster_queue: dict[str, Any] = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ClusterQueue",
        "metadata": {"name": namespace},
        "spec": {
            "namespaceSelector": {},
            "resourceGroups": [
                {
                    "coveredResources": ["cpu", "memory"],
                    "flavors": [
                        {
                            "name": flavor,
                            "resources": [
                                {"name": "cpu", "nominalQuota": cpu},
                                {"name": "memory", "nominalQuota": "64Gi"},
                            ],
                        }
                    ],
                }
            ],
        },
    }
    if preemption:
        cluster_queue["spec"]["preemption"] = {"withinClusterQueue": "LowerPriority"}
    return [
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ResourceFlavor",
            "metadata": {"name": flavor},
            "spec": {"nodeLabels": {"kubernetes.io/hostname": "node-1"}},
        },
        cluster_queue,
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "LocalQueue",
            "metadata": {"name": "research", "namespace": namespace},
            "spec": {"clusterQueue": namespace},
        },
    ]


def rljob(name: str, namespace: str, *, max_epochs: int = 2, **extra: Any) -> dict[str, Any]:
    requests = {"resources": {"requests": {"cpu": POD_CPU, "memory": "256Mi"}}}
    spec: dict[str, Any] = {
        "engine": "sync",
        "policy": {"type": "PPO", "modelCfg": {"hiddenSizes": [16]}, "algoCfg": {"updateEpochs": 1}},
        "env": {"id": "CartPole-v1", "numEnvs": 2},
        "train": {
            "maxEpochs": max_epochs,
            "stepsPerEpoch": 128,
            "fragmentLength": 16,
            "batchSize": 64,
            "evalInterval": 0,
            "saveInterval": 0,
        },
        "trainer": {"replicas": 1, **requests},
        "evaluator": {"replicas": 1, **requests},
        "log": {"intervalSeconds": 1},
        "scheduling": {"gang": "kueue", "queue": "research", "kueueIntegration": "RLJob"},
    }
    for key, value in extra.items():
        spec[key] = {**spec.get(key, {}), **value}
    return {
        "apiVersion": "rlkube.io/v1alpha1",
        "kind": "RLJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def condition(job: dict[str, Any] | None, kind: str) -> dict[str, Any]:
    for found in ((job or {}).get("status") or {}).get("conditions") or []:
        if found["type"] == kind:
            return dict(found)
    return {}


def phase(kube: KueueCluster, name: str, namespace: str) -> str:
    return str(((kube.get("rlj", name, namespace) or {}).get("status") or {}).get("phase", ""))


def job_pods(kube: KueueCluster, name: str, namespace: str) -> list[dict[str, Any]]:
    return kube.items("pods", namespace, "-l", f"rlkube.io/job-name={name}")


def test_two_rljobs_on_a_cluster_queue_with_room_for_one_run_one_after_the_other(
    kueue_cluster: KueueCluster,
) -> None:
    kube = kueue_cluster
    ns = kube.namespace()
    kube.apply(*queues(ns, cpu="3"))  # one job (2 CPUs) fits, two do not
    kube.apply(rljob("first", ns, max_epochs=120))  # ~4 epochs/s here: running while the second waits
    wait_for(
        lambda: phase(kube, "first", ns) == "Running",
        timeout=300,
        interval=1,
        what=f"the first job to run; {kube.logs()}",
    )
    # The admitted flavour's node labels reached the first job's pods: they run on node-1 only.
    pods = job_pods(kube, "first", ns)
    assert pods
    assert {p["spec"]["nodeSelector"]["kubernetes.io/hostname"] for p in pods} == {"node-1"}
    assert {p["spec"].get("nodeName") for p in pods} == {"node-1"}
    kube.apply(rljob("second", ns))
    wait_for(
        lambda: (
            "insufficient unused quota" in condition(kube.get("rlj", "second", ns), "Suspended")["message"]
        ),
        timeout=120,
        interval=0.5,
        what=f"the second job to be Queued for want of quota (Kueue's words); {kube.logs()}",
    )
    second = kube.get("rlj", "second", ns)
    assert second is not None
    assert second["status"]["phase"] == "Suspended", second["status"]
    assert condition(second, "Suspended")["reason"] == "Queued"
    assert second["status"]["message"].startswith("queued by Kueue (Pending): couldn't assign flavors")
    workload = kube.get("workloads.kueue.x-k8s.io", "rljob-second", ns)
    assert workload is not None
    assert [(p["name"], p["count"]) for p in workload["spec"]["podSets"]] == [("train", 1), ("eval", 1)]
    assert workload["metadata"]["ownerReferences"][0]["kind"] == "RLJob"
    assert phase(kube, "first", ns) == "Running"  # the second waits for it, not for nothing
    assert not job_pods(kube, "second", ns)  # queued: no pod at all

    wait_for(
        lambda: phase(kube, "first", ns) in ("Complete", "Failed"),
        timeout=600,
        interval=1,
        what=f"the first job to finish; {kube.logs()}",
    )
    assert phase(kube, "first", ns) == "Complete"
    finished = condition(kube.get("workloads.kueue.x-k8s.io", "rljob-first", ns), "Finished")
    assert finished.get("status") == "True", finished
    wait_for(
        lambda: phase(kube, "second", ns) in ("Complete", "Failed"),
        timeout=600,
        interval=1,
        what=f"the second job to run once the first freed the quota, and finish; {kube.logs()}",
    )
    second = kube.get("rlj", "second", ns)
    assert second is not None
    assert second["status"]["phase"] == "Complete", second["status"]
    assert condition(second, "Suspended")["reason"] == "Admitted"
    # Kueue admitted the second only once the operator had marked the first's Workload Finished.
    admitted = condition(kube.get("workloads.kueue.x-k8s.io", "rljob-second", ns), "Admitted")
    assert admitted["lastTransitionTime"] >= finished["lastTransitionTime"]
    events = kube.kubectl("get", "events", "-n", ns, "--field-selector", "involvedObject.name=second").stdout
    assert "Queued" in events
    assert "Admitted" in events


def test_deleting_an_rljob_removes_its_workload(kueue_cluster: KueueCluster) -> None:
    kube = kueue_cluster
    ns = kube.namespace()
    kube.apply(*queues(ns, cpu="0"))  # no room: the job stays queued
    kube.apply(rljob("doomed", ns))
    wait_for(
        lambda: kube.get("workloads.kueue.x-k8s.io", "rljob-doomed", ns),
        timeout=120,
        what=f"the job's Workload; {kube.logs()}",
    )
    wait_for(
        lambda: condition(kube.get("rlj", "doomed", ns), "Suspended").get("reason") == "Queued",
        timeout=120,
        what=f"the job to be Queued; {kube.logs()}",
    )
    kube.kubectl("delete", "rlj", "doomed", "-n", ns, "--wait=true", "--timeout=60s")
    wait_for(
        lambda: kube.get("workloads.kueue.x-k8s.io", "rljob-doomed", ns) is None,
        timeout=120,
        what="garbage collection to remove the Workload",
    )


def priority_classes() -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": name},
            "value": value,
            "preemptionPolicy": "Never",  # Kueue preempts; the scheduler need not
        }
        for name, value in (("rlkube-test-low", 10), ("rlkube-test-high", 1000))
    ]


def checkpoint_claim(namespace: str) -> list[dict[str, Any]]:
    """A claim bound to a PersistentVolume of its own (the node agent keeps its files on the node)."""
    return [
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": f"{namespace}-runs"},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": "",
                "hostPath": {"path": f"/tmp/rlkube-{namespace}-runs"},
                "claimRef": {"namespace": namespace, "name": "runs"},
            },
        },
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "runs", "namespace": namespace},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": "",
                "volumeName": f"{namespace}-runs",
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
    ]


#: Epochs of the job that is preempted: ~4 epochs/s on 2 cores, so it is still training when the
#: higher-priority job arrives and Kueue preempts it.
LOW_EPOCHS = 150


def epoch(kube: KueueCluster, name: str, namespace: str) -> int:
    status = (kube.get("rlj", name, namespace) or {}).get("status") or {}
    return int((status.get("progress") or {}).get("epoch") or 0)


def test_a_higher_priority_job_preempts_a_running_one_which_resumes_from_its_checkpoint(
    kueue_cluster: KueueCluster,
) -> None:
    kube = kueue_cluster
    ns = kube.namespace()
    kube.apply(*priority_classes())
    kube.apply(*queues(ns, cpu="3", preemption=True), *checkpoint_claim(ns))
    low = rljob(
        "low",
        ns,
        max_epochs=LOW_EPOCHS,
        trainer={"priorityClassName": "rlkube-test-low"},
        checkpoint={"claimName": "runs"},
    )
    kube.apply(low)
    wait_for(
        lambda: epoch(kube, "low", ns) >= 2,
        timeout=300,
        interval=1,
        what=f"the low-priority job to train a few epochs; {kube.logs()}",
    )
    kube.apply(rljob("high", ns, trainer={"priorityClassName": "rlkube-test-high"}))
    wait_for(
        lambda: condition(kube.get("rlj", "low", ns), "Suspended").get("reason") == "Preempted",
        timeout=120,
        interval=0.5,
        what=f"Kueue to preempt the low-priority job; {kube.logs()}",
    )
    preempted_at = epoch(kube, "low", ns)
    wait_for(
        lambda: phase(kube, "high", ns) in ("Complete", "Failed"),
        timeout=600,
        interval=1,
        what=f"the high-priority job to run in the released quota and finish; {kube.logs()}",
    )
    assert phase(kube, "high", ns) == "Complete"
    wait_for(
        lambda: phase(kube, "low", ns) in ("Complete", "Failed"),
        timeout=600,
        interval=1,
        what=f"the preempted job to be admitted again and finish; {kube.logs()}",
    )
    finished = kube.get("rlj", "low", ns)
    assert finished is not None
    assert finished["status"]["phase"] == "Complete", finished["status"]
    assert finished["status"]["progress"]["epoch"] == LOW_EPOCHS
    # The second incarnation of train rank 0 resumed from the checkpoint the first one saved on SIGTERM.
    logs = sorted(kube.cluster.workdir.glob(f"nodes/*/logs/{ns}_low-train-0_*/*.log"))
    resumed = [
        line
        for log in logs
        for line in log.read_text(errors="replace").splitlines()
        if "resumed from" in line
    ]
    assert resumed, f"no 'resumed from' in {logs}"
    assert int(resumed[-1].rsplit("epoch ", 1)[1].rstrip(")")) >= max(1, preempted_at - 1), resumed
    events = kube.kubectl("get", "events", "-n", ns, "--field-selector", "involvedObject.name=low").stdout
    assert "Preempted" in events
    # Nothing acknowledged was lost and nothing trained twice, over both incarnations (the run's summary,
    # in the checkpoint claim as the node agents keep it).
    summaries = wait_for(
        lambda: sorted(kube.cluster.claim(ns, "runs").glob("**/summary.json")),
        timeout=120,
        what="train rank 0 to write the run's summary into the checkpoint claim",
    )
    summary = json.loads(summaries[-1].read_text())
    per_epoch = 128 // (2 * 16)  # stepsPerEpoch / (numEnvs * fragmentLength)
    assert len(summary["incarnations"]) == 2, summary["incarnations"]
    assert (
        summary["fragments_acknowledged_total"]
        == summary["fragments_trained_total"]
        == LOW_EPOCHS * per_epoch
    )


def test_kubectl_scale_beyond_quota_leaves_the_extra_eval_pods_waiting_without_touching_training(
    kueue_cluster: KueueCluster,
) -> None:
    kube = kueue_cluster
    ns = kube.namespace()
    kube.apply(*queues(ns, cpu="3"))  # the job (2 CPUs) and one more eval pod fit
    kube.apply(rljob("elastic", ns, max_epochs=400))
    wait_for(
        lambda: phase(kube, "elastic", ns) == "Running",
        timeout=300,
        interval=1,
        what=f"the job to run; {kube.logs()}",
    )
    train = kube.get("pod", "elastic-train-0", ns)
    assert train is not None

    kube.kubectl("scale", "rlj/elastic", "-n", ns, "--replicas=4")  # 3 more: only 1 CPU is free
    wait_for(
        lambda: (
            condition(kube.get("workloads.kueue.x-k8s.io", "rljob-elastic-eval", ns), "QuotaReserved").get(
                "reason"
            )
            == "Pending"
        ),
        timeout=120,
        interval=0.5,
        what=f"the eval slice of 3 to wait for quota; {kube.logs()}",
    )
    sts = kube.get("statefulset", "elastic-eval", ns)
    assert sts is not None
    assert sts["spec"]["replicas"] == 1  # the extra eval pods wait: none is created
    assert phase(kube, "elastic", ns) == "Running"

    kube.kubectl("scale", "rlj/elastic", "-n", ns, "--replicas=2")  # 1 more: fits
    wait_for(
        lambda: (
            len(
                [p for p in job_pods(kube, "elastic", ns) if p["metadata"]["name"].startswith("elastic-eval")]
            )
            == 2
        ),
        timeout=180,
        interval=0.5,
        what=f"the admitted eval slice to add its pod; {kube.logs()}",
    )
    same = kube.get("pod", "elastic-train-0", ns)
    assert same is not None
    assert same["metadata"]["uid"] == train["metadata"]["uid"]  # training was never restarted
    assert sum(s.get("restartCount", 0) for s in same["status"].get("containerStatuses") or []) == 0
    kube.kubectl("delete", "rlj", "elastic", "-n", ns, "--wait=true", "--timeout=60s")
    wait_for(
        lambda: kube.get("workloads.kueue.x-k8s.io", "rljob-elastic-eval", ns) is None,
        timeout=120,
        what="garbage collection to remove the eval slice",
    )
