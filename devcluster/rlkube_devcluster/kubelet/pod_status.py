"""A pod's status and Events as a kubelet reports them, from what the process kubelet knows of its container.

Pure: the caller passes the times (``times`` keeps each condition's last transition, and is
updated in place so a condition's time changes only when its status does).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlkube_devcluster.kubelet.downward import now_rfc3339

SKIPPED_INIT = "skipped by the cluster-in-a-box kubelet (processes run as the current user)"
CONDITIONS = ("PodScheduled", "Initialized", "ContainersReady", "Ready")


@dataclass(frozen=True)
class ContainerView:
    container: dict[str, Any]
    running: bool
    started_at: str
    pid: int | None
    restarts: int
    waiting: tuple[str, str]
    last_terminated: dict[str, Any] | None
    #: False once restartPolicy says the container stays terminated
    restartable: bool


def container_state(view: ContainerView) -> dict[str, Any]:
    if view.running:
        return {"running": {"startedAt": view.started_at}}
    if not view.restartable and view.last_terminated is not None:
        return {"terminated": dict(view.last_terminated)}
    reason, message = view.waiting
    return {"waiting": {"reason": reason, **({"message": message} if message else {})}}


def phase_of(view: ContainerView) -> str:
    if view.running:
        return "Running"
    if not view.restartable and view.last_terminated is not None:
        return "Succeeded" if view.last_terminated["exitCode"] == 0 else "Failed"
    return "Running" if view.started_at else "Pending"


def pod_status(
    view: ContainerView,
    *,
    init_containers: list[dict[str, Any]],
    start_time: str,
    times: dict[str, tuple[str, str]],
    stamp: str | None = None,
) -> dict[str, Any]:
    stamp = stamp or now_rfc3339()
    ready = view.running
    values = {"PodScheduled": True, "Initialized": True, "ContainersReady": ready, "Ready": ready}
    conditions = []
    for kind in CONDITIONS:
        value = "True" if values[kind] else "False"
        if times.get(kind, ("", ""))[0] != value:
            times[kind] = (value, stamp)
        conditions.append({"type": kind, "status": value, "lastTransitionTime": times[kind][1]})
    status: dict[str, Any] = {
        "phase": phase_of(view),
        "hostIP": "127.0.0.1",
        "podIP": "127.0.0.1",
        "podIPs": [{"ip": "127.0.0.1"}],
        "startTime": start_time,
        "conditions": conditions,
        "containerStatuses": [
            {
                "name": view.container.get("name", ""),
                "image": view.container.get("image", ""),
                "imageID": "",
                **({"containerID": f"process://{view.pid}"} if view.pid is not None else {}),
                "ready": ready,
                "started": view.running,
                "restartCount": view.restarts,
                "state": container_state(view),
                "lastState": {"terminated": dict(view.last_terminated)} if view.last_terminated else {},
            }
        ],
    }
    if init_containers:
        status["initContainerStatuses"] = [
            {
                "name": c.get("name", ""),
                "image": c.get("image", ""),
                "imageID": "",
                "ready": True,
                "restartCount": 0,
                "state": {
                    "terminated": {
                        "exitCode": 0,
                        "reason": "Completed",
                        "message": SKIPPED_INIT,
                        "startedAt": start_time,
                        "finishedAt": start_time,
                    }
                },
            }
            for c in init_containers
        ]
    return status


def pod_event(
    namespace: str,
    pod: str,
    uid: str,
    kind: str,
    reason: str,
    message: str,
    component: str,
    node: str,
    *,
    stamp: str | None = None,
) -> dict[str, Any]:
    """A core/v1 Event about a pod (``kind``: Normal or Warning)."""
    stamp = stamp or now_rfc3339()
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{pod}."},
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Pod",
            "namespace": namespace,
            "name": pod,
            "uid": uid,
        },
        "type": kind,
        "reason": reason,
        "message": message,
        "source": {"component": component, **({"host": node} if component == "kubelet" else {})},
        "reportingComponent": component,
        "reportingInstance": node,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
