"""What runs beside a real API server: the StatefulSet controller, garbage collection, a kubelet.

* :class:`StatefulSetController` creates pods ``<sts>-<i>`` from the template (with the
  ``apps.kubernetes.io/pod-index`` and ``statefulset.kubernetes.io/pod-name`` labels and an owner
  reference), deletes pods above ``replicas``, replaces pods of an older template revision one at
  a time as ``RollingUpdate`` does (highest ordinal first, each after the one above is Ready;
  ``partition`` and ``OnDelete`` honoured), and keeps the StatefulSet's status (replicas,
  readyReplicas, current and updated replicas and revisions, observedGeneration).
* :class:`DanglingOwnerCollector` deletes objects created with owners that are already gone.
* a kubelet turns pods into running ones. :class:`ReadyKubelet` binds each pod to a simulated
  node and reports it Running and Ready at once, and can simulate a container crash (restart
  count +1). A kubelet that runs the pod's command as a local process (the cluster-in-a-box)
  implements the same :class:`Kubelet` protocol; :func:`pod_environment` resolves the
  downward-API fields of a pod's env for it.

All of it runs on the emulator's event loop and writes through the same :class:`Store` as the
HTTP API, so watchers (kopf, kubectl -w) see every change.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import json
import re
from typing import Any, Protocol

from rlkube_devcluster.emulator.resources import ResourceType
from rlkube_devcluster.emulator.store import Store, WatchEvent, now_rfc3339

LABEL_POD_INDEX = "apps.kubernetes.io/pod-index"
LABEL_POD_NAME = "statefulset.kubernetes.io/pod-name"
LABEL_REVISION = "controller-revision-hash"


def _is_ready(pod: dict[str, Any]) -> bool:
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return condition.get("status") == "True"
    return False


def template_revision(sts: dict[str, Any]) -> str:
    template = json.dumps(sts.get("spec", {}).get("template", {}), sort_keys=True)
    return hashlib.sha256(template.encode()).hexdigest()[:10]


class StatefulSetController:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.sts_type = store.find("apps", "v1", "statefulsets")
        self.pod_type = store.find("", "v1", "pods")
        self._pending: set[tuple[str, str]] = set()
        store.listeners.append(self._on_event)

    def _on_event(self, rtype: ResourceType, event: WatchEvent) -> None:
        if rtype == self.sts_type:
            key = (event.obj["metadata"]["namespace"], event.obj["metadata"]["name"])
        elif rtype == self.pod_type:
            owner = next(
                (
                    r
                    for r in event.obj["metadata"].get("ownerReferences") or []
                    if r.get("kind") == "StatefulSet"
                ),
                None,
            )
            if owner is None:
                return
            key = (event.obj["metadata"]["namespace"], owner["name"])
        else:
            return
        if key not in self._pending:
            self._pending.add(key)
            asyncio.get_running_loop().call_soon(self._run, key)

    def _run(self, key: tuple[str, str]) -> None:
        self._pending.discard(key)
        self.reconcile(*key)

    def reconcile(self, namespace: str, name: str) -> None:
        assert self.sts_type is not None
        assert self.pod_type is not None
        sts = self.store.get(self.sts_type, namespace, name)
        if sts is None or sts["metadata"].get("deletionTimestamp"):
            return
        uid = sts["metadata"]["uid"]
        desired = int(sts["spec"].get("replicas", 1))
        revision = f"{name}-{template_revision(sts)}"
        pods = {
            p["metadata"]["name"]: p
            for p in self.store.items(self.pod_type, namespace)
            if any(r.get("uid") == uid for r in p["metadata"].get("ownerReferences") or [])
        }
        for pod_name in list(pods):
            ordinal = _ordinal(name, pod_name)
            if ordinal is None or ordinal >= desired:
                self.store.delete(self.pod_type, namespace, pod_name)
                del pods[pod_name]
        for ordinal in range(desired):
            pod_name = f"{name}-{ordinal}"
            if pod_name not in pods:
                pods[pod_name] = self.store.create(
                    self.pod_type, namespace, self._pod(sts, ordinal, revision), keep_status=True
                )
        victim = rolling_update_victim(sts, pods, revision=revision)
        if victim is not None:
            # Its replacement is created on the delete event's reconcile, with the new template.
            self.store.delete(self.pod_type, namespace, victim)
            del pods[victim]
        ready = sum(1 for p in pods.values() if _is_ready(p))
        updated = sum(1 for p in pods.values() if _revision(p) == revision)
        previous = (sts.get("status") or {}).get("currentRevision") or revision
        status = {
            "observedGeneration": sts["metadata"].get("generation", 1),
            "replicas": len(pods),
            "readyReplicas": ready,
            "availableReplicas": ready,
            "currentReplicas": len(pods) if updated == len(pods) else len(pods) - updated,
            "updatedReplicas": updated,
            "currentRevision": revision if updated == len(pods) else previous,
            "updateRevision": revision,
            "collisionCount": 0,
        }

        def write(live: dict[str, Any]) -> dict[str, Any]:
            live["status"] = status
            return live

        self.store.update(self.sts_type, namespace, name, write, subresource="status")

    @staticmethod
    def _pod(sts: dict[str, Any], ordinal: int, revision: str) -> dict[str, Any]:
        name = sts["metadata"]["name"]
        template = copy.deepcopy(sts["spec"].get("template", {}))
        meta = template.get("metadata", {})
        pod_name = f"{name}-{ordinal}"
        spec = template.get("spec", {})
        spec["hostname"] = pod_name
        if sts["spec"].get("serviceName"):
            spec["subdomain"] = sts["spec"]["serviceName"]
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod_name,
                "labels": {
                    **meta.get("labels", {}),
                    LABEL_POD_INDEX: str(ordinal),
                    LABEL_POD_NAME: pod_name,
                    LABEL_REVISION: revision,
                },
                "annotations": meta.get("annotations", {}),
                "ownerReferences": [
                    {
                        "apiVersion": "apps/v1",
                        "kind": "StatefulSet",
                        "name": name,
                        "uid": sts["metadata"]["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": spec,
            "status": {"phase": "Pending"},
        }


def _revision(pod: dict[str, Any]) -> str | None:
    labels: dict[str, str] = pod["metadata"].get("labels") or {}
    return labels.get(LABEL_REVISION)


def rolling_update_victim(
    sts: dict[str, Any], pods: dict[str, dict[str, Any]], *, revision: str
) -> str | None:
    """The one pod a ``RollingUpdate`` replaces now, as Kubernetes' StatefulSet controller picks it.

    From the highest ordinal down to ``partition``: the first pod of an older revision is deleted
    (healthy or not); an updated pod that is not Ready yet (or not created yet) stops the walk, so
    pods are replaced one at a time, each after the one above it is Ready. ``OnDelete``: never.
    """
    strategy = sts["spec"].get("updateStrategy") or {}
    if strategy.get("type") == "OnDelete":
        return None
    partition = int((strategy.get("rollingUpdate") or {}).get("partition") or 0)
    name = sts["metadata"]["name"]
    for ordinal in range(int(sts["spec"].get("replicas", 1)) - 1, partition - 1, -1):
        pod = pods.get(f"{name}-{ordinal}")
        if pod is None:
            return None
        if _revision(pod) != revision and not pod["metadata"].get("deletionTimestamp"):
            return f"{name}-{ordinal}"
        if not _is_ready(pod):
            return None
    return None


def _ordinal(sts_name: str, pod_name: str) -> int | None:
    match = re.fullmatch(re.escape(sts_name) + r"-(\d+)", pod_name)
    return int(match.group(1)) if match else None


class DanglingOwnerCollector:
    """Objects whose every owner is gone are deleted (e.g. applied just after the owner's deletion)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        store.listeners.append(self._on_event)

    def _on_event(self, rtype: ResourceType, event: WatchEvent) -> None:
        if event.type == "ADDED" and event.obj["metadata"].get("ownerReferences"):
            asyncio.get_running_loop().call_soon(self.store.collect_dangling, rtype, event.obj)


class Kubelet(Protocol):
    """Runs the pods bound to its nodes; reports their status through the store."""

    def attach(self, store: Store) -> None: ...

    async def close(self) -> None: ...


class ReadyKubelet:
    """Every pod starts at once and is Ready; nodes ``node-0..N-1`` by ordinal; crashes on request."""

    def __init__(self, nodes: int = 2) -> None:
        self.nodes = max(1, nodes)
        self.store: Store | None = None
        self.pod_type: ResourceType | None = None

    def attach(self, store: Store) -> None:
        self.store = store
        self.pod_type = store.find("", "v1", "pods")
        store.listeners.append(self._on_event)

    async def close(self) -> None:
        return None

    def _on_event(self, rtype: ResourceType, event: WatchEvent) -> None:
        if rtype == self.pod_type and event.type == "ADDED":
            meta = event.obj["metadata"]
            asyncio.get_running_loop().call_soon(self.start, meta["namespace"], meta["name"])

    def node_for(self, pod: dict[str, Any]) -> str:
        index = int(pod["metadata"].get("labels", {}).get(LABEL_POD_INDEX, "0") or 0)
        return f"node-{index % self.nodes}"

    def start(self, namespace: str, name: str) -> None:
        assert self.store is not None
        assert self.pod_type is not None
        pod = self.store.get(self.pod_type, namespace, name)
        if pod is None or pod["metadata"].get("deletionTimestamp"):
            return
        node = self.node_for(pod)

        def bind(live: dict[str, Any]) -> dict[str, Any]:
            live["spec"]["nodeName"] = node
            return live

        self.store.update(self.pod_type, namespace, name, bind)
        self._set_status(namespace, name, restarts=0, ready=True)

    def crash(self, namespace: str, name: str) -> int:
        """The pod's containers exit and restart once; returns the new restart count."""
        assert self.store is not None
        assert self.pod_type is not None
        pod = self.store.get(self.pod_type, namespace, name)
        if pod is None:
            raise KeyError(f"no pod {namespace}/{name}")
        statuses = (pod.get("status") or {}).get("containerStatuses") or [{}]
        restarts = int(statuses[0].get("restartCount", 0)) + 1
        self._set_status(namespace, name, restarts=restarts, ready=True)
        return restarts

    def _set_status(self, namespace: str, name: str, *, restarts: int, ready: bool) -> None:
        assert self.store is not None
        assert self.pod_type is not None
        stamp = now_rfc3339()

        def write(live: dict[str, Any]) -> dict[str, Any]:
            containers = live.get("spec", {}).get("containers") or []
            index = int(live["metadata"].get("labels", {}).get(LABEL_POD_INDEX, "0") or 0)
            live["status"] = {
                "phase": "Running",
                "hostIP": "10.0.0.1",
                "podIP": f"10.1.{index // 250}.{index % 250 + 2}",
                "startTime": live.get("status", {}).get("startTime", stamp),
                "conditions": [
                    {"type": t, "status": "True" if ready else "False", "lastTransitionTime": stamp}
                    for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
                ],
                "containerStatuses": [
                    {
                        "name": c.get("name", "main"),
                        "image": c.get("image", ""),
                        "ready": ready,
                        "started": True,
                        "restartCount": restarts,
                        "state": {"running": {"startedAt": stamp}},
                    }
                    for c in containers
                ],
            }
            return live

        self.store.update(self.pod_type, namespace, name, write, subresource="status")


_FIELD_REF = re.compile(r"^metadata\.(labels|annotations)\['([^']+)'\]$")


def pod_environment(pod: dict[str, Any], container: dict[str, Any]) -> dict[str, str]:
    """The env a container would get: values as written, downward-API ``fieldRef`` fields resolved."""
    env: dict[str, str] = {}
    for item in container.get("env") or []:
        if "value" in item:
            env[item["name"]] = str(item["value"])
            continue
        ref = ((item.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath", "")
        match = _FIELD_REF.match(ref)
        if match:
            env[item["name"]] = str((pod["metadata"].get(match.group(1)) or {}).get(match.group(2), ""))
        elif ref == "metadata.name":
            env[item["name"]] = pod["metadata"]["name"]
        elif ref == "metadata.namespace":
            env[item["name"]] = pod["metadata"].get("namespace", "")
        elif ref == "metadata.uid":
            env[item["name"]] = pod["metadata"].get("uid", "")
        elif ref == "spec.nodeName":
            env[item["name"]] = (pod.get("spec") or {}).get("nodeName", "")
        elif ref == "status.podIP":
            env[item["name"]] = (pod.get("status") or {}).get("podIP", "")
        elif ref:
            raise ValueError(f"unsupported downward API field {ref!r} in env {item['name']}")
    return env
