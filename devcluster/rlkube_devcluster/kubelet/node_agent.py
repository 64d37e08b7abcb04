"""The node agent: a kubelet-shaped client of a real API server that runs its Node's pods as processes.

:class:`NodeAgent` acts under a node identity (a ``system:node:<name>`` client certificate in the
``system:nodes`` group), so the API server's Node authorizer and NodeRestriction admission give it
exactly a kubelet's rights. It

1. registers its Node: capacity and allocatable (cpu, memory, pods, and ``nvidia.com/gpu`` when the
   node has GPUs), addresses, the Ready condition; and keeps its Lease in ``kube-node-lease`` and
   its Ready condition fresh (the node lifecycle controller marks a silent node NotReady);
2. runs only the pods the scheduler bound to it (``spec.nodeName``), one process per pod, with the
   process kubelet's sandbox (:mod:`.sandbox`: volumes as directories, the pod's projected
   ServiceAccount token from the TokenRequest API, ConfigMaps and Secrets it may read) and env
   (downward API, ``KUBERNETES_SERVICE_HOST``/``PORT`` pointing at the API server);
3. reports pod status through ``pods/status`` as the kubelet does (:mod:`.pod_status`: phase,
   podIP and hostIP, conditions, container state, exit code, termination message, restarts per
   ``restartPolicy`` with the kubelet's back-off);
4. honours graceful deletion: a pod with a ``deletionTimestamp`` gets SIGTERM, SIGKILL after its
   grace period, and is then deleted for good (grace period 0, preconditioned on its uid).

The loop polls the node's pods (a field selector on ``spec.nodeName``) every ``poll_interval``.
Run as root, each container gets a mount namespace of its own in which its projected volumes
(the ServiceAccount token, the cluster's CA, the namespace) are at their ``mountPath``, where the
kubernetes client's in-cluster config looks for them (:func:`.sandbox.in_mount_namespace`). With
``stand_in`` set, every container runs that command instead of its own (``sleep infinity``): pods
are Running and Ready, nothing of theirs runs, and killing the process is a container crash.

What it does not do: images, resource limits, probes, init containers (reported Completed), and a
network per pod: every pod is 127.0.0.1. So it rewrites an RLJob pod's
service names and ports to this host's (:mod:`.podnet`, with the ``networks`` every agent of the
machine shares: :class:`.network_thread.NetworkThread`, which also opens each job's coordinator
proxy for the operator). A container sees its projected files at the
host path the sandbox chose, not at their ``mountPath`` (no mount namespaces).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rlkube import contract
from rlkube.launch.processes import RestartBackOff, signal_group, spawn

from rlkube_devcluster.kubelet.api_client import ApiError, KubeApi
from rlkube_devcluster.kubelet.downward import now_rfc3339, pod_environment
from rlkube_devcluster.kubelet.network_thread import NetworkThread
from rlkube_devcluster.kubelet.pod_run import PodRun, base_env
from rlkube_devcluster.kubelet.pod_status import ContainerView, pod_event, pod_status
from rlkube_devcluster.kubelet.podnet import cluster_addresses
from rlkube_devcluster.kubelet.sandbox import (
    Node,
    PodSandbox,
    SandboxError,
    container_command,
    in_mount_namespace,
)
from rlkube_devcluster.kubelet.termination import (
    TERMINATION_PATH_VARIABLE,
    fresh_termination_file,
    termination_message,
)

logger = logging.getLogger(__name__)

NODE_LEASE_NAMESPACE = "kube-node-lease"
GPU_RESOURCE = "nvidia.com/gpu"


@dataclass(frozen=True)
class NodeCapacity:
    """What the Node offers the scheduler (capacity = allocatable here: nothing is reserved)."""

    cpu: str = "4"
    memory: str = "8Gi"
    pods: int = 110
    gpus: int = 0

    def resources(self) -> dict[str, str]:
        out = {"cpu": self.cpu, "memory": self.memory, "pods": str(self.pods), "ephemeral-storage": "100Gi"}
        if self.gpus:
            out[GPU_RESOURCE] = str(self.gpus)
        return out


def _micro_time() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class NodeAgent:
    """One Node of a real cluster whose bound pods run as local processes; see the module docstring."""

    def __init__(
        self,
        kubeconfig: Path,
        name: str,
        workdir: Path,
        *,
        capacity: NodeCapacity = NodeCapacity(),
        api_port: int,
        labels: Mapping[str, str] | None = None,
        taints: list[dict[str, str]] | None = None,
        backoff: RestartBackOff = RestartBackOff(),
        max_grace: float = 30.0,
        close_grace: float = 15.0,
        poll_interval: float = 0.3,
        heartbeat_seconds: float = 10.0,
        lease_seconds: int = 40,
        python: str = sys.executable,
        environ: Mapping[str, str] | None = None,
        networks: NetworkThread | None = None,
        stand_in: Sequence[str] | None = None,
        mount_namespaces: bool | None = None,
        memory: Path | None = None,
        claims: Path | None = None,
    ) -> None:
        self.name = name
        self.stand_in = list(stand_in) if stand_in is not None else None
        if mount_namespaces is None:
            mount_namespaces = os.geteuid() == 0 and shutil.which("unshare") is not None
        self.mount_namespaces = mount_namespaces
        self.networks = networks
        self.workdir = workdir
        self.capacity = capacity
        self.api_port = api_port
        self.labels = dict(labels or {})
        self.taints = list(taints or [])
        self.backoff = backoff
        self.max_grace = max_grace
        self.close_grace = close_grace
        self.poll_interval = poll_interval
        self.heartbeat_seconds = heartbeat_seconds
        self.lease_seconds = lease_seconds
        self.python = python
        self.base_env = base_env(os.environ if environ is None else environ)
        self.api = KubeApi(kubeconfig)
        # The node's memory (emptyDir medium Memory, /dev/shm paths): a directory under /dev/shm
        # where the caller gives one; PersistentVolumeClaims: one directory per claim, which
        # agents of one machine share when given the same ``claims``.
        self.node = Node(name, workdir / "disk", memory or workdir / "memory")
        self.claims = claims or workdir / "claims"
        self.runs: dict[str, PodRun] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"node-agent-{name}", daemon=True)
        self._last_heartbeat = 0.0

    # Life ------------------------------------------------------------------------------------

    def start(self) -> NodeAgent:
        """Register the Node (Ready) and its Lease, then run its pods until :meth:`stop`."""
        (self.workdir / "logs").mkdir(parents=True, exist_ok=True)
        self._register()
        self._heartbeat()
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop every process (SIGTERM, SIGKILL after ``close_grace``) and the loop; the Node stays."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        live = [r for r in self.runs.values() if r.popen is not None]
        for run in live:
            signal_group(run.popen.pid, signal.SIGTERM)  # type: ignore[union-attr]
        deadline = time.monotonic() + self.close_grace
        while any(r.popen.poll() is None for r in live) and time.monotonic() < deadline:  # type: ignore[union-attr]
            time.sleep(0.1)
        for run in live:
            assert run.popen is not None
            signal_group(run.popen.pid, signal.SIGKILL)
            run.popen.wait()
            run.popen = None
        self.runs.clear()
        shutil.rmtree(self.node.disk, ignore_errors=True)
        shutil.rmtree(self.node.memory, ignore_errors=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_interval):
            try:
                now = time.monotonic()
                if now - self._last_heartbeat >= self.heartbeat_seconds:
                    self._heartbeat()
                self._sync_pods(now)
            except Exception:  # the agent must outlive its own bugs and the API's hiccups; logged
                logger.exception("node agent %s: sync failed", self.name)

    # The Node and its Lease --------------------------------------------------------------------

    def _register(self) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.name,
                "labels": {
                    "kubernetes.io/hostname": self.name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    **self.labels,
                },
            },
            "spec": {"taints": self.taints} if self.taints else {},
        }
        try:
            self.api.create("/api/v1/nodes", body)
        except ApiError as exc:
            if exc.status != 409:  # registered before (an agent restart): keep the object
                raise

    def _heartbeat(self) -> None:
        self._last_heartbeat = time.monotonic()
        stamp = now_rfc3339()
        resources = self.capacity.resources()
        conditions = [
            {
                "type": kind,
                "status": status,
                "reason": reason,
                "message": message,
                "lastHeartbeatTime": stamp,
            }
            for kind, status, reason, message in (
                ("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory"),
                ("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                ("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
                ("Ready", "True", "KubeletReady", "the node agent is posting ready status"),
            )
        ]
        status = {
            "status": {
                "capacity": resources,
                "allocatable": resources,
                "conditions": conditions,
                "addresses": [
                    {"type": "InternalIP", "address": "127.0.0.1"},
                    {"type": "Hostname", "address": self.name},
                ],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
                "nodeInfo": {
                    "machineID": self.name,
                    "systemUUID": self.name,
                    "bootID": self.name,
                    "kernelVersion": os.uname().release,
                    "osImage": "rlkube node agent",
                    "containerRuntimeVersion": "process://1",
                    "kubeletVersion": "v1.37.2",
                    "kubeProxyVersion": "",
                    "operatingSystem": "linux",
                    "architecture": "amd64",
                },
            }
        }
        # A strategic merge patch merges conditions by type, so each keeps its lastTransitionTime.
        self.api.patch(f"/api/v1/nodes/{self.name}/status", status, strategic=True)
        lease = {
            "metadata": {"name": self.name, "namespace": NODE_LEASE_NAMESPACE},
            "spec": {
                "holderIdentity": self.name,
                "leaseDurationSeconds": self.lease_seconds,
                "renewTime": _micro_time(),
            },
        }
        leases = f"/apis/coordination.k8s.io/v1/namespaces/{NODE_LEASE_NAMESPACE}/leases"
        try:
            self.api.patch(f"{leases}/{self.name}", lease)
        except ApiError as exc:
            if exc.status != 404:
                raise
            self.api.create(leases, lease)

    # Pods ------------------------------------------------------------------------------------

    def _bound_pods(self) -> list[dict[str, Any]]:
        return list(self.api.get("/api/v1/pods", fieldSelector=f"spec.nodeName={self.name}")["items"])

    def _sync_pods(self, now: float) -> None:
        pods = {p["metadata"]["uid"]: p for p in self._bound_pods()}
        for uid, pod in pods.items():
            if uid not in self.runs and not pod["metadata"].get("deletionTimestamp"):
                if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                    continue  # finished before this agent started: nothing to run
                self._admit(pod)
            elif uid in self.runs and pod["metadata"].get("deletionTimestamp"):
                self.runs[uid].deleting = True
        for uid, run in list(self.runs.items()):
            if uid not in pods:  # removed without grace (a forced delete): stop it at once
                run.deleting = True
                run.grace = 0.0
            self._step(run, pods.get(uid), now)
        if self.networks is not None:
            self.networks.busy(self.name, {(r.namespace, r.job) for r in self.runs.values() if r.job})

    def _admit(self, pod: dict[str, Any]) -> None:
        meta, spec = pod["metadata"], pod.get("spec") or {}
        containers = spec.get("containers") or [{}]
        run = PodRun(
            namespace=meta["namespace"],
            name=meta["name"],
            uid=meta["uid"],
            node=self.node,
            container=containers[0],
            init_containers=list(spec.get("initContainers") or []),
            restart_policy=spec.get("restartPolicy", "Always"),
            grace=float(spec.get("terminationGracePeriodSeconds", 30)),
            job=(meta.get("labels") or {}).get(contract.LABEL_JOB),
            log_dir=self.workdir / "logs" / f"{meta['namespace']}_{meta['name']}_{meta['uid']}",
            start_time=now_rfc3339(),
        )
        if len(containers) != 1:
            run.waiting = ("CreateContainerConfigError", "the node agent runs one container per pod")
            run.next_start = None
        self.runs[run.uid] = run

    def _step(self, run: PodRun, pod: dict[str, Any] | None, now: float) -> None:
        if run.popen is not None:
            code = run.popen.poll()
            if code is not None:
                self._exited(run, code, now)
        if run.deleting:
            self._stopping(run, now)
            return
        if run.popen is None and run.next_start is not None and now >= run.next_start and pod is not None:
            self._start(run, pod, now)
        self._report(run)

    def _exited(self, run: PodRun, code: int, now: float) -> None:
        assert run.popen is not None
        signal_group(run.popen.pid, signal.SIGKILL)  # what is left of the container goes with it
        run.popen = None
        run.last_terminated = {
            "exitCode": code if code >= 0 else 128 - code,
            "reason": "Completed" if code == 0 else "Error",
            "startedAt": run.started_at,
            "finishedAt": now_rfc3339(),
            "containerID": f"process://{run.pid}",
        }
        message = termination_message(run, failed=code != 0)
        if message:
            run.last_terminated["message"] = message
        if run.deleting:
            return
        if run.restart_policy == "Never" or (run.restart_policy == "OnFailure" and code == 0):
            run.next_start = None
            return
        run.failures = self.backoff.failures_after_exit(run.failures, now - run.started_mono)
        delay = self.backoff.delay(run.failures)
        run.next_start = now + delay
        run.waiting = ("CrashLoopBackOff", f"back-off {delay:g}s restarting failed container")
        self._event(
            run, "Warning", "BackOff", f"Back-off {delay:g}s restarting failed container (exit code {code})"
        )

    def _stopping(self, run: PodRun, now: float) -> None:
        if run.popen is None:
            if run.sandbox is not None:
                run.sandbox.remove()
            del self.runs[run.uid]
            self._delete_for_good(run)
            return
        if not run.term_sent:
            run.term_sent = True
            run.kill_at = now + min(run.grace, self.max_grace)
            signal_group(run.popen.pid, signal.SIGTERM)
            self._event(run, "Normal", "Killing", f"Stopping container {run.container.get('name', '')}")
        elif run.kill_at is not None and now >= run.kill_at:
            run.kill_at = None
            signal_group(run.popen.pid, signal.SIGKILL)

    def _delete_for_good(self, run: PodRun) -> None:
        """The kubelet's last word on a gracefully deleted pod: remove the object now."""
        try:
            self.api.delete(
                f"/api/v1/namespaces/{run.namespace}/pods/{run.name}",
                {"gracePeriodSeconds": 0, "preconditions": {"uid": run.uid}},
            )
        except ApiError as exc:
            if exc.status not in (404, 409):  # gone already, or a new pod of the same name
                raise

    def _start(self, run: PodRun, pod: dict[str, Any], now: float) -> None:
        try:
            command, env = (
                (list(self.stand_in), dict(self.base_env)) if self.stand_in else self._prepare(run, pod)
            )
        except (SandboxError, ValueError, OSError, ApiError) as exc:
            run.failures += 1
            run.next_start = now + self.backoff.delay(run.failures)
            run.waiting = ("CreateContainerConfigError", str(exc))
            self._event(run, "Warning", "Failed", f"Error: {exc}")
            return
        first = not run.started_at
        restart = run.restarts + (not first)
        run.log_dir.mkdir(parents=True, exist_ok=True)
        log_file = run.log_dir / f"{restart}.log"
        try:
            run.popen = spawn(
                command, env, log_file, cwd=run.sandbox.rootfs if run.sandbox else None, die_with_us=False
            )
        except OSError as exc:
            run.failures += 1
            run.next_start = now + self.backoff.delay(run.failures)
            run.waiting = ("RunContainerError", f"{command[0]}: {exc}")
            self._event(run, "Warning", "Failed", f"Error: {command[0]}: {exc}")
            return
        run.restarts = restart
        run.log_file = log_file
        run.pid = run.popen.pid
        self._event(
            run, "Normal", "Started", f"Started container {run.container.get('name', '')} (pid {run.pid})"
        )
        run.started_at = now_rfc3339()
        run.started_mono = now

    def _prepare(self, run: PodRun, pod: dict[str, Any]) -> tuple[list[str], dict[str, str]]:
        if run.sandbox is None:
            run.sandbox = PodSandbox(pod, run.node, self.claims)
        run.sandbox.create()
        base = f"/api/v1/namespaces/{run.namespace}"
        run.sandbox.write_config_maps(lambda name: self.api.get_or_none(f"{base}/configmaps/{name}"))
        run.sandbox.write_secrets(lambda name: self.api.get_or_none(f"{base}/secrets/{name}"))
        run.sandbox.write_projected(
            token=lambda audience, seconds: self._token(pod, audience, seconds),
            config_map=lambda name: self.api.get_or_none(f"{base}/configmaps/{name}"),
        )
        pod = {**pod, "status": {**(pod.get("status") or {}), "podIP": "127.0.0.1", "hostIP": "127.0.0.1"}}
        env = run.sandbox.rewrite_paths(run.container, pod_environment(pod, run.container))
        if run.job and self.networks is not None:
            ports = self.networks.ports(run.namespace, run.job, agent=self.name)
            env = cluster_addresses(env, job=run.job, namespace=run.namespace, ports=ports)
        for directory in run.sandbox.contract_dirs(env):
            directory.mkdir(parents=True, exist_ok=True)
        env[TERMINATION_PATH_VARIABLE] = str(fresh_termination_file(run))
        cluster = {
            "KUBERNETES_SERVICE_HOST": "127.0.0.1",
            "KUBERNETES_SERVICE_PORT": str(self.api_port),
            # The container runtime's: the pod's hostname (its name unless spec.hostname says otherwise).
            "HOSTNAME": (pod.get("spec") or {}).get("hostname") or pod["metadata"]["name"],
        }
        command = container_command(run.container, python=self.python)
        binds = run.sandbox.projected_mounts(run.container)
        if self.mount_namespaces and binds:
            command = in_mount_namespace(command, binds)
        return command, {**self.base_env, **cluster, **env}

    def _token(self, pod: dict[str, Any], audience: str | None, seconds: int) -> str:
        """A token for the pod's ServiceAccount, bound to the pod (TokenRequest), as the kubelet gets it."""
        meta = pod["metadata"]
        account = (pod.get("spec") or {}).get("serviceAccountName") or "default"
        request = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                **({"audiences": [audience]} if audience else {}),
                "expirationSeconds": max(seconds, 600),
                "boundObjectRef": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": meta["name"],
                    "uid": meta["uid"],
                },
            },
        }
        answer = self.api.create(
            f"/api/v1/namespaces/{meta['namespace']}/serviceaccounts/{account}/token", request
        )
        return str(answer["status"]["token"])

    def processes(self) -> dict[tuple[str, str], dict[str, Any]]:
        """(namespace, pod) -> pid (None while not running), restarts, node, terminating."""
        return {
            (r.namespace, r.name): {
                "pid": r.pid if r.popen is not None else None,
                "restarts": r.restarts,
                "node": self.name,
                "terminating": r.deleting,
            }
            for r in sorted(list(self.runs.values()), key=lambda r: not r.deleting)  # a live pod wins
        }

    # Reporting -----------------------------------------------------------------------------------

    def _report(self, run: PodRun) -> None:
        view = ContainerView(
            container=run.container,
            running=run.running,
            started_at=run.started_at,
            pid=run.pid,
            restarts=run.restarts,
            waiting=run.waiting,
            last_terminated=run.last_terminated,
            restartable=run.next_start is not None,
        )
        status = pod_status(
            view, init_containers=run.init_containers, start_time=run.start_time, times=run.condition_times
        )
        if status == run.written:
            return
        try:
            self.api.patch(f"/api/v1/namespaces/{run.namespace}/pods/{run.name}/status", {"status": status})
        except ApiError as exc:  # the pod went between the list and this write
            logger.debug("status of %s/%s not written: %s", run.namespace, run.name, exc)
            return
        run.written = status

    def _event(self, run: PodRun, kind: str, reason: str, message: str) -> None:
        body = pod_event(run.namespace, run.name, run.uid, kind, reason, message, "kubelet", self.name)
        try:
            self.api.create(f"/api/v1/namespaces/{run.namespace}/events", body)
        except ApiError as exc:  # e.g. the namespace is going away
            logger.debug("event %s of %s/%s not stored: %s", reason, run.namespace, run.name, exc)
