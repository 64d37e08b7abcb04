"""The reconciler with an in-memory API and Kueue's decisions written by hand: queued at zero,
started on admission with the flavour's node labels, stopped on eviction, released once the pods
are gone (what tests/kueue/test_rljob_as_a_kueue_workload.py shows against the real Kueue)."""

from __future__ import annotations

import copy
from typing import Any

from rlkube_operator.reconcile import Reconciler
from rlkube_operator.settings import OperatorSettings

from tests.kueue.test_kueue_gate import NOW, FakeKube


class ClusterKube(FakeKube):
    """FakeKube with pods to list and a ResourceFlavor."""

    def __init__(self) -> None:
        super().__init__()
        self.pods: list[dict[str, Any]] = []
        self.objects[("ResourceFlavor", "", "default")] = {
            "spec": {"nodeLabels": {"pool": "a100"}, "tolerations": [{"key": "gpu", "operator": "Exists"}]}
        }

    def list(
        self, api_version: str, kind: str, namespace: str, *, label_selector: str
    ) -> list[dict[str, Any]]:
        return self.pods if kind == "Pod" else []

    def replicas(self, name: str) -> int:
        return int(self.objects[("StatefulSet", "team", name)]["spec"]["replicas"])


def job_body() -> dict[str, Any]:
    return {
        "apiVersion": "rlkube.io/v1alpha1",
        "kind": "RLJob",
        "metadata": {"name": "cartpole", "namespace": "team", "uid": "u-1", "generation": 1},
        "spec": {
            "env": {"id": "CartPole-v1"},
            "scheduling": {"gang": "kueue", "queue": "research", "kueueIntegration": "RLJob"},
        },
    }


def refresh(reconciler: Reconciler, body: dict[str, Any]) -> list[tuple[str, str, str]]:
    outcome = reconciler.refresh(body, now=NOW)
    if outcome.status_patch:
        body["status"] = {**(body.get("status") or {}), **copy.deepcopy(outcome.status_patch)}
    return [(e.type, e.reason, e.message) for e in outcome.events]


def suspended(body: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in body["status"]["conditions"] if c["type"] == "Suspended")


def test_a_job_runs_only_while_kueue_admits_it_and_is_released_after_its_pods_are_gone() -> None:
    kube = ClusterKube()
    reconciler = Reconciler(
        kube=kube,  # type: ignore[arg-type]
        settings=OperatorSettings(),
        ask_coordinator=lambda target, timeout, token: None,
    )
    body = job_body()
    applied = reconciler.reconcile(body, now=NOW)
    assert "queued by Kueue" in applied.events[0].message
    assert kube.replicas("cartpole-train") == 0
    refresh(reconciler, body)
    assert suspended(body)["reason"] == "Queued"
    assert body["status"]["phase"] == "Suspended"

    kube.admit("rljob-cartpole")
    events = refresh(reconciler, body)
    assert kube.replicas("cartpole-train") == 1
    assert kube.replicas("cartpole-eval") == 1
    pod = kube.objects[("StatefulSet", "team", "cartpole-train")]["spec"]["template"]["spec"]
    assert pod["nodeSelector"]["pool"] == "a100"
    assert {"key": "gpu", "operator": "Exists"} in pod["tolerations"]
    assert any(reason == "Admitted" for _, reason, _ in events), events
    assert suspended(body)["reason"] == "Admitted"

    kube.evict("rljob-cartpole")
    kube.pods = [{"metadata": {"name": "cartpole-train-0", "uid": "p-1"}, "status": {}}]
    events = refresh(reconciler, body)
    assert kube.replicas("cartpole-train") == 0  # SIGTERM: train rank 0 checkpoints in its grace
    assert ("Warning", "Preempted") in [(t, r) for t, r, _ in events], events
    assert kube.objects[("Workload", "team", "rljob-cartpole")]["status"]["admission"] is not None
    kube.pods = []
    events = refresh(reconciler, body)
    assert kube.objects[("Workload", "team", "rljob-cartpole")]["status"]["admission"] is None
    assert any(reason == "KueueWorkload" for _, reason, _ in events), events
    assert suspended(body)["reason"] == "Preempted"
