"""End to end on the cluster-in-a-box: kubectl applies a CartPole RLJob, the real operator creates its
StatefulSets, the real control plane makes and binds their pods, the node agents run them
(``rlkube pod``), training reaches ``Complete``.

The job is small (two train ranks, 4 envs, 512 steps an epoch) but long enough in epochs that a
``kubectl scale`` after the first epochs lands while it trains. Every wait polls with a generous
deadline; the figures (apply to Running, apply to Complete, scale to workers registered) are
printed (``pytest -s``), not asserted.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import re
import signal
import socket
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from rlkube._proto import policy_group_pb2 as pb
from rlkube._proto import policy_group_pb2_grpc as pb_grpc
from rlkube.security.credential import Credential
from rlkube.security.grpc_auth import open_channel
from rlkube_devcluster.operator_process import OperatorProcess
from rlkube_devcluster.waiting import wait_for

from tests.box.conftest import Box, Seen, alive, pid_of, start_operator
from tests.operator.conftest import Kubectl
from tests.operator.harness import kubectl
from tests.runtime.slow_env import ENV_ID as SLOW_ENV

pytestmark = pytest.mark.slow

NAME = "cartpole-box"
MAX_EPOCHS = 60
JOB: dict[str, Any] = {
    "apiVersion": "rlkube.io/v1alpha1",
    "kind": "RLJob",
    "metadata": {"name": NAME},
    "spec": {
        "engine": "sync",
        "policy": {
            "type": "PPO",
            "modelCfg": {"hiddenSizes": [32, 32]},
            "algoCfg": {"updateEpochs": 2},
            "weightBuffer": {"strategy": "Shared"},
        },
        "env": {"id": "CartPole-v1", "numEnvs": 4},
        "train": {
            "maxEpochs": MAX_EPOCHS,
            "stepsPerEpoch": 512,
            "fragmentLength": 16,
            "batchSize": 64,
            "evalInterval": 0,
            "saveInterval": 20,
        },
        "trainer": {"replicas": 2},
        "evaluator": {"replicas": 1},
        "log": {"intervalSeconds": 1},
    },
}


@pytest.fixture(scope="module")
def operator(box: Box) -> Iterator[OperatorProcess]:
    process = start_operator(box, "operator-rljob.log")
    yield process
    process.stop()


def table(k: Kubectl) -> dict[str, str]:
    """``kubectl get rlj NAME`` as column -> value."""
    header, row = k("get", "rlj", NAME).stdout.strip().splitlines()
    return dict(zip(re.split(r"\s{2,}", header), re.split(r"\s{2,}", row), strict=False))


def coordinator_status(box: Box, k: Kubectl) -> pb.JobStatus | None:
    """GetStatus through the same address the operator uses, with the job's credential."""
    secret = json.loads(k("get", "secret", f"{NAME}-credential", "-o", "json").stdout)
    token = base64.b64decode(secret["data"]["token"]).decode().strip()
    target = box.cluster.coordinator_target(k.namespace, NAME)
    with open_channel(target, Credential.of_token(token)) as channel:
        try:
            return pb_grpc.PolicyGroupStub(channel).GetStatus(pb.GetStatusRequest(), timeout=5)
        except grpc.RpcError:
            return None


def train_pods(k: Kubectl) -> dict[str, tuple[str, str, int]]:
    """train pod -> (uid, containerID, restartCount)."""
    pods = json.loads(
        k("get", "pods", "-l", f"rlkube.io/job-name={NAME},rlkube.io/role=train", "-o", "json").stdout
    )
    return {
        p["metadata"]["name"]: (
            p["metadata"]["uid"],
            p["status"]["containerStatuses"][0]["containerID"],
            p["status"]["containerStatuses"][0]["restartCount"],
        )
        for p in pods["items"]
    }


def first(events: list[Seen], phase: str) -> float:
    return next(e.at for e in events if e.obj.get("status", {}).get("phase") == phase)


def test_a_cartpole_rljob_trains_to_complete_and_a_mid_run_scale_adds_workers_without_restarting_training(
    box: Box, k: Kubectl, operator: OperatorProcess
) -> None:
    events = box.record(k, "rlj")
    # CartPole with 2 ms steps (an epoch takes at least 1 s with one worker): however fast the
    # machine, training lasts longer than the scaled workers take to start and register.
    # The env's hold file is the handshake that the scale lands mid-run: while it exists rollouts wait.
    hold = box.workdir / f"hold-{k.namespace}"
    job = copy.deepcopy(JOB)
    job["spec"]["env"].update(
        id=SLOW_ENV, imports=["tests.runtime.slow_env"], kwargs={"hold_file": str(hold)}
    )
    k.apply(job)

    # Running, with progress in the printer columns.
    running = wait_for(
        lambda: (t := table(k))["PHASE"] == "Running" and int(t["EPOCH"]) >= 1 and t.get("RETURN") and t,
        timeout=240,
        interval=0.5,
        what="the job Running with an epoch and a return in kubectl get rlj",
    )
    assert int(running["PUBLISHED"]) >= 1
    assert 0 <= int(running["LOADED"]) <= int(running["PUBLISHED"])
    assert float(running["RETURN"]) > 0
    assert running["TRAIN"] == "2/2"
    before = train_pods(k)
    assert len(before) == 2
    train_generation = k.get("statefulset", f"{NAME}-train")["metadata"]["generation"]
    assert box.cluster.networks is not None
    ports = box.cluster.networks.get(k.namespace, NAME)
    assert ports is not None
    # The Shared strategy's hostPath init container is skipped, and says so.
    init = k.get("pod", f"{NAME}-eval-0")["status"]["initContainerStatuses"][0]
    assert init["state"]["terminated"]["reason"] == "Completed"

    # Scale mid-run: the eval StatefulSet grows and the new workers register with the coordinator.
    hold.touch()
    scaled_at = time.monotonic()
    k("scale", f"rlj/{NAME}", "--replicas=3")
    wait_for(
        lambda: (k.get("statefulset", f"{NAME}-eval") or {}).get("status", {}).get("readyReplicas") == 3,
        timeout=120,
        what="3 ready eval pods",
    )
    registered = wait_for(
        lambda: (s := coordinator_status(box, k)) is not None and s.eval_workers == 3 and s,
        timeout=240,
        interval=0.5,
        what="3 eval workers registered with the coordinator",
    )
    registered_after = time.monotonic() - scaled_at
    hold.unlink()
    assert not registered.finished
    assert registered.epoch < MAX_EPOCHS
    # Training was not restarted: same pods, same processes, no restarts, the train StatefulSet untouched.
    assert train_pods(k) == before
    assert all(alive(pid_of(k.get("pod", name))) for name in before)
    assert k.get("statefulset", f"{NAME}-train")["metadata"]["generation"] == train_generation

    result = kubectl(
        box.cluster.kubeconfig,
        "-n",
        k.namespace,
        "wait",
        "--for=condition=Complete",
        f"rlj/{NAME}",
        "--timeout=400s",
        timeout=430,
    )
    assert "condition met" in result.stdout
    final = k.get("rlj", NAME)
    assert final["status"]["phase"] == "Complete"
    assert final["status"]["progress"]["epoch"] == MAX_EPOCHS
    assert final["status"]["train"]["restarts"] == 0
    # The progress moved while the job ran: the status went through increasing epochs.
    epochs = [
        e.obj["status"]["progress"]["epoch"]
        for e in events
        if e.obj.get("status", {}).get("phase") == "Running" and "progress" in e.obj["status"]
    ]
    assert len(set(epochs)) >= 3
    assert epochs == sorted(epochs)
    # ... and the scale showed in its EVAL column while it trained.
    assert any(
        e.obj["status"].get("phase") == "Running" and e.obj["status"].get("eval", {}).get("ready") == "3/3"
        for e in events
        if "status" in e.obj
    )
    # cleanPodPolicy All: both StatefulSets go to zero and every process stops.
    wait_for(lambda: not box.processes(k.namespace), timeout=120, what="every pod's processes gone")
    # ... and the job's ports and coordinator proxy with them.
    wait_for(lambda: not box.cluster.coordinator_socket(k.namespace, NAME).exists(), what="the proxy gone")
    for port in (ports.coordinator, ports.master, *ports.weights.values()):
        with socket.socket() as probe:
            # SO_REUSEADDR: connections closed a moment ago may linger in TIME_WAIT; a listener may not.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(("127.0.0.1", port))  # free again: no process of the job listens on it

    added = next(e.at for e in events if e.type == "ADDED")
    print(
        f"\nbox figures: apply->Running {first(events, 'Running') - added:.1f} s, "
        f"apply->Complete {first(events, 'Complete') - added:.1f} s, "
        f"scale->3 workers registered {registered_after:.1f} s (registered at epoch {registered.epoch})"
    )


def test_a_killed_train_rank_restarts_in_its_pod_and_the_job_resumes_from_its_checkpoint(
    box: Box, k: Kubectl, operator: OperatorProcess
) -> None:
    job = copy.deepcopy(JOB)
    job["spec"]["train"].update(maxEpochs=40, saveInterval=5)
    k.apply(job)
    wait_for(
        lambda: (k.get("rlj", NAME) or {}).get("status", {}).get("progress", {}).get("epoch", 0) >= 6,
        timeout=240,
        interval=0.5,
        what="epoch 6",
    )
    killed = k.get("pod", f"{NAME}-train-1")
    seen = box.record(k, "pods")  # every write of a pod, in order: the first restart's status among them

    def train_1_at(restarts: int) -> dict[str, Any] | None:
        """The first version of train-1 the watch saw with ``restarts`` restarts, once it has."""
        for event in list(seen):
            status = (event.obj.get("status", {}).get("containerStatuses") or [{}])[0]
            if event.obj["metadata"]["name"] == f"{NAME}-train-1" and status.get("restartCount") == restarts:
                return event.obj
        return None

    # The watch lists the pods before it follows them: kill only once it has, so no write is missed.
    wait_for(lambda: train_1_at(0), timeout=60, interval=0.1, what="the pod watch listed train-1")
    os.kill(pid_of(killed), signal.SIGKILL)

    # The kubelet restarts the container in the same pod (rank 0 fails with it: its peer is gone).
    # The first restart's lastState is the kill; later ones (a restarted rank that finds its peers
    # still restarting may exit again) replace it, so it is read at the first restart, as the watch
    # delivered it (a GET may see it before the watch does).
    first = wait_for(lambda: train_1_at(1), timeout=120, interval=0.1, what="train-1 restarted")
    assert first["metadata"]["uid"] == killed["metadata"]["uid"]
    assert first["status"]["containerStatuses"][0]["lastState"]["terminated"]["exitCode"] == 137

    def restarted() -> dict[str, Any] | None:
        live = k.get("pod", f"{NAME}-train-1")
        status = (live or {}).get("status", {}).get("containerStatuses", [{}])[0]
        return live if status.get("restartCount", 0) >= 1 and status.get("ready") else None

    live = wait_for(restarted, timeout=120, what="train-1 restarted and ready")
    assert live["metadata"]["uid"] == killed["metadata"]["uid"]
    result = kubectl(
        box.cluster.kubeconfig,
        "-n",
        k.namespace,
        "wait",
        "--for=condition=Complete",
        f"rlj/{NAME}",
        "--timeout=400s",
        timeout=430,
    )
    assert "condition met" in result.stdout
    final = k.get("rlj", NAME)["status"]
    assert final["progress"]["epoch"] == 40
    assert final["train"]["restarts"] >= 1
    # Rank 0 came back from the newest checkpoint of its run directory (its pod's emptyDir). Its pod
    # is gone by now (cleanPodPolicy); the kubelet's log files of every container start remain.
    logs = box.container_logs(k.namespace, f"{NAME}-train-0")
    assert len(logs) >= 2, logs
    log = logs[-1].read_text()
    assert re.search(r"resuming after epoch (5|10|15|20|25|30|35)\b", log), log[-2000:]
