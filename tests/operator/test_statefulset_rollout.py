"""The emulator's StatefulSet controller rolls a template change out as Kubernetes' does.

``RollingUpdate`` (the default) replaces one pod at a time, from the highest ordinal down, each
only after the pod above it is Ready again; ``partition`` keeps the lower ordinals; ``OnDelete``
replaces nothing. Pods here become Ready only when the test says so.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from rlkube_devcluster.emulator.cluster import EmulatedCluster
from rlkube_devcluster.emulator.controllers import ReadyKubelet
from rlkube_devcluster.waiting import wait_for

from tests.operator.conftest import Kubectl


class HeldKubelet(ReadyKubelet):
    """Binds and runs every pod, but reports it Ready only on :meth:`release`."""

    def start(self, namespace: str, name: str) -> None:
        assert self.store is not None
        assert self.pod_type is not None
        pod = self.store.get(self.pod_type, namespace, name)
        if pod is None or pod["metadata"].get("deletionTimestamp"):
            return
        self._set_status(namespace, name, restarts=0, ready=False)

    def release(self, namespace: str, name: str) -> None:
        self._set_status(namespace, name, restarts=0, ready=True)


@pytest.fixture(scope="module")
def cluster(workdir: Path) -> Iterator[EmulatedCluster]:
    emulated = EmulatedCluster(workdir, kubelet=HeldKubelet()).start()
    yield emulated
    emulated.stop()


def statefulset(version: str, **strategy: Any) -> str:
    sts = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 3,
            "serviceName": "web",
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}, "annotations": {"version": version}},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]},
            },
            **({"updateStrategy": strategy} if strategy else {}),
        },
    }
    return yaml.safe_dump(sts)


def versions(k: Kubectl) -> dict[str, str]:
    """Pod name -> the template version it runs."""
    pods = json.loads(k("get", "pods", "-l", "app=web", "-o", "json").stdout)["items"]
    return {p["metadata"]["name"]: p["metadata"]["annotations"]["version"] for p in pods}


def release_all(cluster: EmulatedCluster, k: Kubectl) -> None:
    kubelet = cluster.kubelet
    assert isinstance(kubelet, HeldKubelet)
    for name in versions(k):
        cluster.call(kubelet.release, k.namespace, name)


def release(cluster: EmulatedCluster, k: Kubectl, name: str) -> None:
    kubelet = cluster.kubelet
    assert isinstance(kubelet, HeldKubelet)
    cluster.call(kubelet.release, k.namespace, name)


def running(k: Kubectl, expected: dict[str, str]) -> bool:
    return versions(k) == expected


def test_rolling_update_replaces_one_pod_at_a_time_from_the_highest_ordinal(
    cluster: EmulatedCluster, k: Kubectl
) -> None:
    k("apply", "-f", "-", input=statefulset("1"))
    old = {"web-0": "1", "web-1": "1", "web-2": "1"}
    wait_for(lambda: running(k, old), what="three pods of version 1")
    release_all(cluster, k)
    k("apply", "-f", "-", input=statefulset("2"))
    step = {"web-0": "1", "web-1": "1", "web-2": "2"}
    wait_for(lambda: running(k, step), what="only web-2 replaced")
    # web-2 is not Ready: nothing else moves until it is.
    sts = json.loads(k("get", "sts", "web", "-o", "json").stdout)
    assert sts["status"]["updatedReplicas"] == 1
    assert sts["status"]["currentRevision"] != sts["status"]["updateRevision"]
    assert running(k, step)
    release(cluster, k, "web-2")
    step = {"web-0": "1", "web-1": "2", "web-2": "2"}
    wait_for(lambda: running(k, step), what="then web-1")
    release(cluster, k, "web-1")
    new = {"web-0": "2", "web-1": "2", "web-2": "2"}
    wait_for(lambda: running(k, new), what="then web-0")
    release(cluster, k, "web-0")
    wait_for(
        lambda: (
            (s := json.loads(k("get", "sts", "web", "-o", "json").stdout)["status"])["currentRevision"]
            == s["updateRevision"]
        ),
        what="the rollout complete",
    )


def test_partition_keeps_the_lower_ordinals_and_on_delete_replaces_nothing(
    cluster: EmulatedCluster, k: Kubectl
) -> None:
    partitioned = {"type": "RollingUpdate", "rollingUpdate": {"partition": 2}}
    k("apply", "-f", "-", input=statefulset("1", **partitioned))
    wait_for(lambda: len(versions(k)) == 3, what="three pods")
    release_all(cluster, k)
    k("apply", "-f", "-", input=statefulset("2", **partitioned))
    wait_for(lambda: running(k, {"web-0": "1", "web-1": "1", "web-2": "2"}), what="only web-2 replaced")
    release(cluster, k, "web-2")
    k("apply", "-f", "-", input=statefulset("3", type="OnDelete"))
    wait_for(
        lambda: json.loads(k("get", "sts", "web", "-o", "json").stdout)["status"]["updatedReplicas"] == 0,
        what="the OnDelete template observed",
    )
    assert versions(k) == {"web-0": "1", "web-1": "1", "web-2": "2"}
    k("delete", "pod", "web-1")
    wait_for(lambda: versions(k).get("web-1") == "3", what="a deleted pod comes back with the new template")
