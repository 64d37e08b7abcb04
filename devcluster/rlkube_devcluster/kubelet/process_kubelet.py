"""The cluster-in-a-box kubelet: the emulator's pods run as processes on this machine (testing tier 4).

:class:`ProcessKubelet` implements :class:`rlkube_devcluster.emulator.controllers.Kubelet`. For each
pod that appears (the StatefulSet controller creates them) it

1. schedules the pod onto a simulated node, round robin in the order pods appear, and binds it
   (``spec.nodeName``); a node is a disk and a memory directory (:mod:`.sandbox`);
2. makes the pod's volumes, fills in the downward-API fields of the env
   (:func:`.controllers.pod_environment`), maps paths under its mounts to the volumes' directories
   and the job's service names and ports to this host's (:mod:`.podnet`);
3. starts the container's command (the image entrypoint ``rlkube`` plus ``args``) as a process in a
   session of its own, its output in ``<workdir>/logs/<ns>_<pod>_<uid>/<restart>.log`` (the
   emulator serves it as ``pods/log``: ``kubectl logs [-f] [--previous]``);
4. reports the pod through the status subresource: phase, the Ready condition, and a container
   status with state, last state, ``restartCount`` and ``containerID: process://<pid>``; and posts
   the Events a kubelet posts (Scheduled, Started, BackOff, Killing, Failed);
5. gives each container start a fresh termination message file (its ``terminationMessagePath``,
   here a file of the pod's directory named by ``RLKUBE_TERMINATION_MESSAGE_PATH``) and copies
   what the container wrote there into the terminated state's ``message`` when it exits, as the
   kubelet does (at most 4096 bytes; ``FallbackToLogsOnError``: the log's tail when nothing was
   written and the exit code is not 0; :mod:`.termination`).

A container that exits is started again per ``restartPolicy`` (a StatefulSet's is Always) after
a back-off (:class:`~rlkube.launch.processes.RestartBackOff`: the kubelet's 10 s doubling to 5 min
by default; ``RestartBackOff.kubelet(speedup=N)`` or any ``RestartBackOff(initial, cap)`` for
tests), shown as ``CrashLoopBackOff``; every process left in its group is killed first, as a
container's cgroup would be. A deleted pod (scale-down, garbage collection, ``kubectl delete``) gets
SIGTERM, then SIGKILL after its ``terminationGracePeriodSeconds`` (at most ``max_grace``); its
emptyDirs go with it. The emulator removes a pod object at once, so a new pod of the same name
(a StatefulSet's replacement) is held in ``ContainerCreating`` until the old processes are
gone, which is the ordering a real StatefulSet keeps.

What it does not emulate: init containers are skipped and reported ``Completed``; the only one
the operator renders (``weights-dir``) chowns a hostPath to the image's user, which needs root,
and here every process runs as the current user, who owns the directories the kubelet makes.
Probes are not run (render sets gRPC ones; here a running container is Ready). One container per pod (the
operator renders one). The image, resources, securityContext and node selectors are ignored.

:meth:`ProcessKubelet.close` stops every process (SIGTERM, SIGKILL after ``close_grace``), closes
the service proxies and removes the nodes' directories; the logs stay in ``<workdir>/logs``.
Everything runs on the emulator's event loop.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rlkube import contract
from rlkube.launch.processes import RestartBackOff, signal_group, spawn

from rlkube_devcluster.emulator.controllers import pod_environment
from rlkube_devcluster.emulator.resources import ResourceType
from rlkube_devcluster.emulator.store import Store, WatchEvent, now_rfc3339
from rlkube_devcluster.kubelet.pod_run import PodRun, base_env
from rlkube_devcluster.kubelet.pod_status import ContainerView, pod_event, pod_status
from rlkube_devcluster.kubelet.podnet import JobNetworks, JobPorts, cluster_addresses, proxy_socket
from rlkube_devcluster.kubelet.sandbox import Node, PodSandbox, SandboxError, container_command
from rlkube_devcluster.kubelet.termination import (
    TERMINATION_PATH_VARIABLE,
    fresh_termination_file,
    termination_message,
)

logger = logging.getLogger(__name__)


class ProcessKubelet:
    """Runs the emulator's pods as local processes; see the module docstring."""

    def __init__(
        self,
        workdir: Path,
        *,
        nodes: int = 2,
        socket_dir: Path | None = None,
        backoff: RestartBackOff = RestartBackOff(),
        max_grace: float = 30.0,
        close_grace: float = 15.0,
        poll_interval: float = 0.2,
        python: str = sys.executable,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.workdir = workdir
        self.node_count = max(1, nodes)
        self.backoff = backoff
        self.max_grace = max_grace
        self.close_grace = close_grace
        self.poll_interval = poll_interval
        self.python = python
        self.base_env = base_env(os.environ if environ is None else environ)
        self._socket_dir = socket_dir
        self._own_socket_dir = socket_dir is None
        self.shm_root: Path | None = None
        self.nodes: list[Node] = []
        self.runs: dict[str, PodRun] = {}
        self.networks: JobNetworks | None = None
        self.store: Store | None = None
        self.pod_type: ResourceType | None = None
        self._pending: dict[tuple[str, str], None] = {}
        self._scheduled = 0
        self._tick_soon = False
        self._task: asyncio.Task[None] | None = None
        self._closing = False

    # Kubelet protocol --------------------------------------------------------------------------

    @property
    def socket_dir(self) -> Path:
        """Where the coordinator proxies' unix sockets are (``<namespace>.<job>.sock``)."""
        assert self._socket_dir is not None, "the kubelet makes its socket directory when attached"
        return self._socket_dir

    def attach(self, store: Store) -> None:
        if self._socket_dir is None:
            # unix socket paths must stay short (108 bytes): a directory of their own under /tmp
            self._socket_dir = Path(tempfile.mkdtemp(prefix="rlkbox"))
        self.store = store
        self.pod_type = store.find("", "v1", "pods")
        shm_base = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
        self.shm_root = Path(tempfile.mkdtemp(prefix="rlkube-box-", dir=shm_base))
        disk_root = self.workdir / "nodes"
        self.nodes = [
            Node(f"node-{i}", disk_root / f"node-{i}", self.shm_root / f"node-{i}")
            for i in range(self.node_count)
        ]
        (self.workdir / "logs").mkdir(parents=True, exist_ok=True)
        self.networks = JobNetworks(self.socket_dir)
        store.listeners.append(self._on_event)
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def close(self) -> None:
        self._closing = True
        if self._task is not None:
            self._task.cancel()
        live = [r for r in self.runs.values() if r.popen is not None]
        for run in live:
            signal_group(run.popen.pid, signal.SIGTERM)  # type: ignore[union-attr]
        deadline = time.monotonic() + self.close_grace
        while any(r.popen.poll() is None for r in live) and time.monotonic() < deadline:  # type: ignore[union-attr]
            await asyncio.sleep(0.1)
        for run in live:
            assert run.popen is not None
            signal_group(run.popen.pid, signal.SIGKILL)
            run.popen.wait()
            run.popen = None
        self.runs.clear()
        if self.networks is not None:
            await self.networks.close()
        if self.shm_root is not None:
            shutil.rmtree(self.shm_root, ignore_errors=True)
        shutil.rmtree(self.workdir / "nodes", ignore_errors=True)
        if self._own_socket_dir and self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)

    # Views for tests and people ------------------------------------------------------------------

    def coordinator_socket(self, namespace: str, job: str) -> Path:
        return proxy_socket(self.socket_dir, namespace, job)

    def coordinator_target(self, namespace: str, job: str) -> str:
        """Where a job's coordinator answers from outside the pods (the operator's address)."""
        return f"unix://{self.coordinator_socket(namespace, job)}"

    def processes(self) -> dict[tuple[str, str], dict[str, Any]]:
        """(namespace, pod) -> pid (None while not running), restarts, node, terminating; on the loop.

        A deleted pod is listed (terminating) until its processes are gone and its directories removed.
        """
        return {
            (r.namespace, r.name): {
                "pid": r.pid if r.running else None,
                "restarts": r.restarts,
                "node": r.node.name,
                "terminating": r.deleting,
            }
            for r in sorted(self.runs.values(), key=lambda r: not r.deleting)  # a live pod wins
        }

    def container_log(self, pod: Mapping[str, Any], *, previous: bool = False) -> Path | None:
        """The log file of the pod's container now (``previous``: before its last restart), if any.

        The emulator serves it as ``pods/log`` (``kubectl logs [-f] [--previous]``).
        """
        run = self.runs.get(pod["metadata"].get("uid", ""))
        if run is None or run.log_file is None:
            return None
        if not previous:
            return run.log_file
        earlier = run.log_dir / f"{int(run.log_file.stem) - 1}.log"
        return earlier if earlier.exists() else None

    def _event(
        self, run: PodRun, kind: str, reason: str, message: str, *, component: str = "kubelet"
    ) -> None:
        """An Event about the pod, as the kubelet (or the scheduler) posts it (``kubectl describe pod``)."""
        store, _ = self._api()
        events = store.find("", "v1", "events")
        assert events is not None
        body = pod_event(run.namespace, run.name, run.uid, kind, reason, message, component, run.node.name)
        try:
            store.create(events, run.namespace, body)
        except Exception as exc:  # e.g. the namespace is going away
            logger.debug("event %s of %s/%s not stored: %s", reason, run.namespace, run.name, exc)

    def _api(self) -> tuple[Store, ResourceType]:
        assert self.store is not None, "the kubelet is not attached"
        assert self.pod_type is not None
        return self.store, self.pod_type

    # Events --------------------------------------------------------------------------------------

    def _on_event(self, rtype: ResourceType, event: WatchEvent) -> None:
        if rtype != self.pod_type or self._closing:
            return
        meta = event.obj["metadata"]
        if event.type == "ADDED":
            self._pending[(meta["namespace"], meta["name"])] = None
        elif event.type == "DELETED" and meta.get("uid") in self.runs:
            self.runs[meta["uid"]].deleting = True
        else:
            return
        if not self._tick_soon:
            self._tick_soon = True
            asyncio.get_running_loop().call_soon(self._tick)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.poll_interval)
            self._tick()

    def _tick(self) -> None:
        self._tick_soon = False
        if self._closing:
            return
        try:
            now = time.monotonic()
            self._admit_pending()
            for run in list(self.runs.values()):
                self._step(run, now)
            assert self.networks is not None
            self.networks.release_all_but({(r.namespace, r.job) for r in self.runs.values() if r.job})
        except Exception:  # the kubelet must outlive its own bugs; they are logged
            logger.exception("process kubelet tick failed")

    # Admission -----------------------------------------------------------------------------------

    def _admit_pending(self) -> None:
        store, pods = self._api()
        for key in list(self._pending):
            namespace, name = key
            pod = store.get(pods, namespace, name)
            if pod is None or pod["metadata"].get("deletionTimestamp"):
                del self._pending[key]
                continue
            if any((r.namespace, r.name) == key for r in self.runs.values()):
                continue  # the previous pod of this name is still stopping
            del self._pending[key]
            self._admit(pod)

    def _admit(self, pod: dict[str, Any]) -> None:
        store, pods = self._api()
        meta, spec = pod["metadata"], pod.get("spec") or {}
        node = self.nodes[self._scheduled % len(self.nodes)]
        self._scheduled += 1

        def bind(live: dict[str, Any]) -> dict[str, Any]:
            live.setdefault("spec", {})["nodeName"] = node.name
            return live

        store.update(pods, meta["namespace"], meta["name"], bind)
        containers = spec.get("containers") or [{}]
        run = PodRun(
            namespace=meta["namespace"],
            name=meta["name"],
            uid=meta["uid"],
            node=node,
            container=containers[0],
            init_containers=list(spec.get("initContainers") or []),
            restart_policy=spec.get("restartPolicy", "Always"),
            grace=float(spec.get("terminationGracePeriodSeconds", 30)),
            job=(meta.get("labels") or {}).get(contract.LABEL_JOB),
            log_dir=self.workdir / "logs" / f"{meta['namespace']}_{meta['name']}_{meta['uid']}",
            start_time=now_rfc3339(),
        )
        if len(containers) != 1:
            run.waiting = ("CreateContainerConfigError", "the cluster-in-a-box runs one container per pod")
            run.next_start = None
        self.runs[run.uid] = run
        message = f"Successfully assigned {run.namespace}/{run.name} to {node.name}"
        self._event(run, "Normal", "Scheduled", message, component="default-scheduler")

    # One pod's life ------------------------------------------------------------------------------

    def _step(self, run: PodRun, now: float) -> None:
        if run.popen is not None:
            code = run.popen.poll()
            if code is not None:
                self._exited(run, code, now)
        if run.deleting:
            self._stopping(run, now)
            return
        if run.popen is None and run.next_start is not None and now >= run.next_start:
            self._start(run, now)
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
        ran = now - run.started_mono
        run.failures = self.backoff.failures_after_exit(run.failures, ran)
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
            return
        if not run.term_sent:
            run.term_sent = True
            run.kill_at = now + min(run.grace, self.max_grace)
            signal_group(run.popen.pid, signal.SIGTERM)
            self._event(run, "Normal", "Killing", f"Stopping container {run.container.get('name', '')}")
        elif run.kill_at is not None and now >= run.kill_at:
            run.kill_at = None
            signal_group(run.popen.pid, signal.SIGKILL)

    def _start(self, run: PodRun, now: float) -> None:
        store, pods = self._api()
        pod = store.get(pods, run.namespace, run.name)
        if pod is None or pod["metadata"]["uid"] != run.uid:
            run.deleting = True
            return
        try:
            command, env = self._prepare(run, pod)
        except (SandboxError, ValueError, OSError) as exc:
            run.failures += 1
            run.next_start = now + self.backoff.delay(run.failures)
            run.waiting = ("CreateContainerConfigError", str(exc))
            self._event(run, "Warning", "Failed", f"Error: {exc}")
            return
        first = not run.started_at
        restart = run.restarts + (not first)
        run.log_dir.mkdir(parents=True, exist_ok=True)
        log_file = run.log_dir / f"{restart}.log"  # as /var/log/pods/<ns>_<pod>_<uid>/<container>/<n>.log
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
        store, _ = self._api()
        if run.sandbox is None:
            run.sandbox = PodSandbox(pod, run.node, self.workdir / "claims")
        run.sandbox.create()
        config_maps = store.find("", "v1", "configmaps")
        assert config_maps is not None
        run.sandbox.write_config_maps(lambda name: store.get(config_maps, run.namespace, name))
        secrets = store.find("", "v1", "secrets")
        assert secrets is not None
        run.sandbox.write_secrets(lambda name: store.get(secrets, run.namespace, name))
        pod = {**pod, "status": {**(pod.get("status") or {}), "podIP": "127.0.0.1", "hostIP": "127.0.0.1"}}
        env = run.sandbox.rewrite_paths(run.container, pod_environment(pod, run.container))
        if run.job:
            env = cluster_addresses(env, job=run.job, namespace=run.namespace, ports=self._ports(run))
        for directory in run.sandbox.contract_dirs(env):
            directory.mkdir(parents=True, exist_ok=True)
        env[TERMINATION_PATH_VARIABLE] = str(fresh_termination_file(run))
        return container_command(run.container, python=self.python), {**self.base_env, **env}

    # Reporting ------------------------------------------------------------------------------------

    def _report(self, run: PodRun) -> None:
        store, pods = self._api()
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

        def write(live: dict[str, Any]) -> dict[str, Any]:
            live["status"] = status
            return live

        try:
            store.update(pods, run.namespace, run.name, write, subresource="status")
        except Exception as exc:  # the pod went between the tick's read and this write
            logger.debug("status of %s/%s not written: %s", run.namespace, run.name, exc)
            return
        run.written = status

    # Job networks ---------------------------------------------------------------------------------

    def _ports(self, run: PodRun) -> JobPorts:
        assert self.networks is not None
        assert run.job is not None
        return self.networks.ports(run.namespace, run.job)
