"""The node agents run StatefulSet pods as processes: env, volumes, nodes, restarts, scale, deletion.

Pods here run small Python scripts (no runtime), applied with the real kubectl to the real control
plane (its StatefulSet controller creates the pods, its scheduler binds them); every check polls.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from rlkube_devcluster.real_cluster import RealCluster
from rlkube_devcluster.waiting import wait_for

from tests.box.conftest import Box, alive, pid_of, python_container, running_pods, statefulset
from tests.operator.conftest import Kubectl, new_namespace

#: Writes its env to <claim>/<pod>.json, then sleeps until stopped.
REPORT_ENV = """
import json, os, pathlib, time
pathlib.Path(os.environ["OUT"], os.environ["POD"] + ".json").write_text(json.dumps(dict(os.environ)))
time.sleep(3600)
"""
#: Records its start, and its SIGTERM, in <claim>; ignores SIGTERM when IGNORE_TERM=1.
TRAP_TERM = """
import os, pathlib, signal, sys, time
out = pathlib.Path(os.environ["OUT"])
name = os.environ["POD"] + "-" + str(os.getpid())
(out / (name + ".start")).write_text(repr(time.time()))
def on_term(signum, frame):
    (out / (name + ".term")).write_text(repr(time.time()))
    if os.environ.get("IGNORE_TERM") != "1":
        time.sleep(1.0)
        (out / (name + ".exit")).write_text(repr(time.time()))
        sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
while True:
    time.sleep(0.1)
"""
OUT_VOLUME = {"name": "out", "persistentVolumeClaim": {"claimName": "results"}}
OUT_MOUNT = {"name": "out", "mountPath": "/out"}
OUT_ENV = {"name": "OUT", "value": "/out"}


def downward(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def test_pods_run_with_downward_api_env_their_volumes_on_the_nodes_the_scheduler_chose(
    box: Box, k: Kubectl
) -> None:
    container = python_container(
        REPORT_ENV,
        env=[
            OUT_ENV,
            downward("NS", "metadata.namespace"),
            downward("INDEX", "metadata.labels['apps.kubernetes.io/pod-index']"),
            downward("NODE", "spec.nodeName"),
            {"name": "SETTINGS", "value": "/etc/app/settings.txt"},
            {"name": "SCRATCH", "value": "/dev/shm/scratch"},
        ],
        mounts=[
            OUT_MOUNT,
            {"name": "config", "mountPath": "/etc/app"},
            {"name": "shm", "mountPath": "/dev/shm"},
        ],
    )
    volumes = [
        OUT_VOLUME,
        {"name": "config", "configMap": {"name": "app"}},
        {"name": "shm", "emptyDir": {"medium": "Memory"}},
    ]
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "app"},
        "data": {"settings.txt": "x=1"},
    }
    k.apply(config_map)
    box.provide_claim(k, "results")
    k.apply(statefulset("web", container, replicas=3, volumes=volumes))

    pods = wait_for(lambda: running_pods(k, 3), timeout=60, what="3 running pods")
    sts = wait_for(
        lambda: (
            (k.get("sts", "web") or {}).get("status", {}).get("readyReplicas") == 3 and k.get("sts", "web")
        )
    )
    assert sts["status"]["replicas"] == 3
    claim = box.claim(k.namespace, "results")
    reports = wait_for(
        lambda: len(list(claim.glob("*.json"))) == 3 and sorted(claim.glob("*.json")), what="env reports"
    )
    seen_nodes = {}
    for path in reports:
        env = json.loads(path.read_text())
        name, index = env["POD"], int(env["INDEX"])
        assert name == f"web-{index}"
        assert env["NS"] == k.namespace
        assert env["NODE"] == pods[name]["spec"]["nodeName"]
        seen_nodes[name] = env["NODE"]
        assert env["OUT"] == str(claim)
        # A path under a mount is the volume's directory here: the ConfigMap's file, a per-pod memory dir.
        with open(env["SETTINGS"]) as settings:
            assert settings.read() == "x=1"
        assert env["SCRATCH"].startswith(str(box.cluster.shm_root))
        assert name in env["SCRATCH"]
        assert "RLKUBE_COORDINATOR_ADDRESS" not in env  # nothing of the test process's settings leaks in
        assert alive(pid_of(pods[name]))
    # Each pod runs on the node it was bound to: the agents' view agrees with the API's.
    assert set(seen_nodes.values()) <= {"node-0", "node-1"}
    assert {n: p["node"] for n, p in box.processes(k.namespace).items()} == seen_nodes


def test_an_exiting_container_restarts_with_growing_back_off_and_is_counted(box: Box, k: Kubectl) -> None:
    history = box.record(k, "Pod")
    k.apply(statefulset("crash", python_container("import sys; print('bye', flush=True); sys.exit(3)")))

    def restarted() -> dict[str, Any] | None:
        live = k.get("pod", "crash-0")
        status = (live or {}).get("status", {}).get("containerStatuses", [{}])[0]
        return live if status.get("restartCount", 0) >= 3 else None

    live = wait_for(restarted, timeout=60, what="3 restarts")
    status = live["status"]["containerStatuses"][0]
    assert status["lastState"]["terminated"]["exitCode"] == 3
    assert status["lastState"]["terminated"]["reason"] == "Error"
    assert live["status"]["phase"] == "Running"  # restartPolicy Always: the pod stays, its container restarts
    reasons = [
        e.obj["status"]["containerStatuses"][0]["state"].get("waiting", {}).get("reason")
        for e in history
        if e.obj["metadata"]["name"] == "crash-0" and e.obj.get("status", {}).get("containerStatuses")
    ]
    assert "CrashLoopBackOff" in reasons
    events = json.loads(k("get", "events", "-o", "json").stdout)["items"]
    events.sort(key=lambda e: int(e["metadata"]["resourceVersion"]))  # in the order they were posted
    back_offs = [
        e["message"] for e in events if e["involvedObject"]["name"] == "crash-0" and e["reason"] == "BackOff"
    ]
    delays = [float(re.match(r"Back-off ([\d.]+)s", m)[1]) for m in back_offs]
    assert delays[:3] == [0.5, 1.0, 2.0]  # doubling from RestartBackOff.initial, capped at .cap
    assert all(d == 2.0 for d in delays[3:])
    assert all("exit code 3" in m for m in back_offs)
    # A log file per start of the container (the agent serves no `kubectl logs`: no kubelet API).
    logs = box.container_logs(k.namespace, "crash-0")
    assert len(logs) >= 3
    assert all(log.read_text() == "bye\n" for log in logs[:3])


def test_scale_down_sends_sigterm_then_sigkill_after_the_grace_period(box: Box, k: Kubectl) -> None:
    container = python_container(
        TRAP_TERM, env=[OUT_ENV, {"name": "IGNORE_TERM", "value": "1"}], mounts=[OUT_MOUNT]
    )
    box.provide_claim(k, "results")
    k.apply(statefulset("stubborn", container, replicas=2, volumes=[OUT_VOLUME], grace=1))
    pods = wait_for(lambda: running_pods(k, 2), timeout=60, what="2 running pods")
    kept, removed = pid_of(pods["stubborn-0"]), pid_of(pods["stubborn-1"])

    k("scale", "statefulset/stubborn", "--replicas=1")
    wait_for(lambda: not alive(removed), timeout=30, what="the removed pod's process to be killed")
    term = box.claim(k.namespace, "results") / f"stubborn-1-{removed}.term"
    assert term.exists(), "the process was killed without SIGTERM first"
    assert alive(kept)
    assert pid_of(k.get("pod", "stubborn-0")) == kept
    wait_for(lambda: set(box.processes(k.namespace)) == {"stubborn-0"}, what="only stubborn-0 left")


def test_a_replacement_pod_starts_only_after_its_predecessor_has_stopped(box: Box, k: Kubectl) -> None:
    container = python_container(TRAP_TERM, env=[OUT_ENV], mounts=[OUT_MOUNT])
    box.provide_claim(k, "results")
    k.apply(statefulset("solo", container, volumes=[OUT_VOLUME]))
    first = pid_of(wait_for(lambda: running_pods(k, 1), timeout=60, what="a running pod")["solo-0"])

    k("delete", "pod", "solo-0", "--wait=false")  # the StatefulSet controller recreates solo-0 at once
    second = wait_for(
        lambda: (p := running_pods(k, 1)) and pid_of(p["solo-0"]) != first and pid_of(p["solo-0"]),
        timeout=60,
        what="the replacement pod running",
    )
    claim = box.claim(k.namespace, "results")
    stopped = float((claim / f"solo-0-{first}.exit").read_text())
    started = float(wait_for(lambda: (claim / f"solo-0-{second}.start").read_text(), what="the new start"))
    assert started >= stopped


def test_deleting_the_statefulset_stops_every_process_and_removes_pod_directories(
    box: Box, k: Kubectl
) -> None:
    container = python_container(
        "import time; time.sleep(3600)", mounts=[{"name": "scratch", "mountPath": "/scratch"}]
    )
    k.apply(
        statefulset("gone", container, replicas=2, volumes=[{"name": "scratch", "emptyDir": {}}], grace=5)
    )
    pids = [
        pid_of(p) for p in wait_for(lambda: running_pods(k, 2), timeout=60, what="2 running pods").values()
    ]
    pod_dirs = box.pod_dirs(k.namespace, "gone-")
    assert len(pod_dirs) == 2

    k("delete", "statefulset", "gone")
    wait_for(lambda: not any(alive(p) for p in pids), timeout=30, what="every process gone")
    wait_for(lambda: not box.processes(k.namespace), what="the node agents to forget the pods")
    assert not any(d.exists() for d in pod_dirs)


def test_a_pod_whose_volume_cannot_be_made_stays_pending_with_the_reason(box: Box, k: Kubectl) -> None:
    container = python_container(
        "import time; time.sleep(3600)", mounts=[{"name": "cfg", "mountPath": "/cfg"}]
    )
    k.apply(statefulset("nocfg", container, volumes=[{"name": "cfg", "configMap": {"name": "missing"}}]))

    def waiting() -> dict[str, Any] | None:
        status = (k.get("pod", "nocfg-0") or {}).get("status", {})
        state = (status.get("containerStatuses") or [{}])[0].get("state", {})
        return (
            state.get("waiting")
            if status.get("phase") == "Pending" and "message" in state.get("waiting", {})
            else None
        )

    state = wait_for(waiting, timeout=30, what="a waiting container with a reason")
    assert state["reason"] == "CreateContainerConfigError"
    assert 'configmap "missing" not found' in state["message"]
    # Once the ConfigMap exists the kubelet's retry starts the pod.
    k.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "missing"}, "data": {"a": "b"}})
    wait_for(lambda: running_pods(k, 1), timeout=60, what="the pod running once its ConfigMap exists")


def test_stopping_the_box_leaves_no_process_socket_or_shared_memory(tmp_path: Path) -> None:
    cluster = RealCluster(tmp_path, nodes=2).start()
    try:
        new_namespace(cluster.plane, "app")
        k = Kubectl(cluster.plane, "app")
        # A pod of an RLJob (by its label) gets the job's ports and the coordinator's proxy socket.
        container = python_container(
            "import time; time.sleep(3600)",
            env=[{"name": "RLKUBE_COORDINATOR_ADDR", "value": "j-coordinator.app.svc:50051"}],
            mounts=[{"name": "shm", "mountPath": "/dev/shm"}],
        )
        volumes = [{"name": "shm", "emptyDir": {"medium": "Memory"}}]
        k.apply(
            statefulset("j-train", container, replicas=2, volumes=volumes, labels={"rlkube.io/job-name": "j"})
        )
        pids = [pid_of(p) for p in wait_for(lambda: running_pods(k, 2), timeout=60, what="2 pods").values()]
        socket = cluster.coordinator_socket("app", "j")
        wait_for(socket.exists, what="the coordinator proxy's socket")
        assert any(cluster.shm_root.rglob("shm"))
    finally:
        cluster.stop()
    assert not any(alive(p) for p in pids)
    assert not cluster.shm_root.exists()
    assert not cluster.socket_dir.exists()
    assert not list(tmp_path.glob("nodes/*/disk"))
