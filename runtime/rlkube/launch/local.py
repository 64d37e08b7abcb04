"""``rlkube run`` as a local cluster: train ranks and eval workers as processes, like pods.

Every process gets exactly the env contract a pod gets (``rlkube.contract``), with the values a
cluster would fill in: pod and node names, the coordinator's address, one shm directory per
simulated node. The supervisor then behaves like the StatefulSet controller plus the operator:

- an eval worker that dies is started again (a pod restarts); one scaled away gets SIGTERM and
  drains; the eval count follows ``control.json`` in the run directory (``rlkube scale``);
- a train rank that fails takes the whole train group down and up again: every rank resumes
  from the newest checkpoint; what counts against ``runPolicy.backoffLimit`` and when
  ``activeDeadlineSeconds`` is due are :mod:`rlkube.run_policy`'s decisions, the operator's too;
  one that exits on a disk fault (exit 3: no space, read-only) ends the run at once with its
  one-line reason, since a restart would meet the same disk (the run and checkpoint directories
  are checked writable before anything starts);
- an eval worker that keeps failing fails the job once it was restarted more than
  ``runPolicy.evalBackoffLimit`` times (a scale-down is not a failure);
- the job is finished when rank 0 writes the completion marker (``checkpoints/COMPLETE.json``,
  as in a pod every rank then idles until stopped): everything is stopped.

Ctrl-C (or SIGTERM) stops every process (SIGTERM, then SIGKILL after the grace period) and
removes the shm directories. A failure exits non-zero with the failing process's last lines and
the :class:`~rlkube.failure.Failure` read from the traceback it printed (``Outcome.failure``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import torch

from rlkube import contract, run_policy
from rlkube.contract import PodIdentity, Role, TrainRendezvous, build_pod_env
from rlkube.engine.checkpoint import COMPLETE_FILE
from rlkube.engine.disk import EXIT_DISK_FAULT, MARK, DiskFault, check_writable, describe, is_disk_error
from rlkube.engine.failure import read_failure
from rlkube.engine.run_paths import RunPaths
from rlkube.failure import Failure, failure_from_log
from rlkube.health import HEALTH_PORT_ENV
from rlkube.launch.netns import NodeNet
from rlkube.launch.processes import (
    STANDBY_ENV,
    RestartBackOff,
    free_port,
    signal_group,
    spawn,
    standby_can_go,
    standby_is_ready,
    tail,
)
from rlkube.placement import visible_gpu_for_rank
from rlkube.run_policy import RestartLedger
from rlkube.security.credential import new_token, write_token_file
from rlkube.spec import RLJob

CONTROL_FILE = "control.json"
#: Written by the supervisor while it runs: the coordinator's address and every "pod" with its pid.
CLUSTER_FILE = "cluster.json"
LOCAL_NAMESPACE = "local"
#: Seconds a process gets between SIGTERM and SIGKILL (eval workers drain in this time).
GRACE_SECONDS = 20.0
#: An eval worker that keeps dying is restarted after 0.5 s, doubling to 10 s; one that ran for a
#: minute before it died is restarted promptly again.
EVAL_BACKOFF = RestartBackOff(initial=0.5, cap=10.0, reset_after=60.0)


def write_control(run_dir: Path, evaluators: int) -> None:
    """Set the desired eval worker count of the local run in ``run_dir`` (atomically)."""
    path = run_dir / CONTROL_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"evaluators": evaluators}))
    tmp.replace(path)


@dataclass(frozen=True)
class Ports:
    master: int
    coordinator: int
    weights: tuple[int, ...]  # one per train rank: locally they share one host

    @classmethod
    def allocate(cls, train_ranks: int) -> Ports:
        return cls(free_port(), free_port(), tuple(free_port() for _ in range(train_ranks)))


@dataclass(frozen=True)
class Layout:
    """Where things are for one local run."""

    job: RLJob
    run_dir: Path
    shm_root: Path
    nodes: int
    ports: Ports
    #: Where the "pods" bind their servers: loopback unless ``rlkube run --listen`` says otherwise.
    listen_host: str = contract.LISTEN_LOOPBACK
    #: ``rlkube run --netns``: node ``i`` runs in ``netns[i]`` (empty: every node shares this host's).
    netns: tuple[NodeNet, ...] = ()
    #: ``rlkube run --standby``: keep a warm standby of every train rank (imports done), so that a
    #: train group restart does not wait for Python and torch to start.
    standby: bool = False

    @property
    def coordinator_addr(self) -> str:
        """Where the coordinator (train rank 0, on node 0) is reached."""
        host = self.netns[0].address if self.netns else "127.0.0.1"
        return f"{host}:{self.ports.coordinator}"

    def node_host(self, node: int) -> str:
        """The address node ``node`` is reached at (what its servers bind)."""
        return self.netns[node].address if self.netns else self.listen_host

    def exec_prefix(self, role: Role, index: int) -> list[str]:
        """What a command of this "pod" runs under: its node's namespace, if it has one."""
        return self.netns[self.node_of(role, index)].exec_prefix() if self.netns else []

    @property
    def job_file(self) -> Path:
        return self.run_dir / "job.yaml"

    @property
    def token_file(self) -> Path:
        """This run's credential (a fresh random token per run, readable by its owner only)."""
        return self.run_dir / "credential" / contract.TOKEN_KEY

    def node_of(self, role: Role, index: int) -> int:
        # Train ranks share node 0 (the trainer's node); eval replicas are spread round-robin,
        # so node 0 gets the direct slot write and the other nodes fetch over gRPC.
        return 0 if role is Role.TRAIN else index % self.nodes

    def node_name(self, node: int) -> str:
        return f"node-{node}"

    def shm_dir(self, node: int) -> Path:
        return self.shm_root / self.node_name(node)

    def pod_name(self, role: Role, index: int) -> str:
        base = (
            contract.train_statefulset_name(self.job.name)
            if role is Role.TRAIN
            else contract.eval_statefulset_name(self.job.name)
        )
        return f"{base}-{index}"


def pod_env(layout: Layout, role: Role, index: int, *, metrics_port: int = 0) -> dict[str, str]:
    """The env contract for one local "pod" (the same names render.py sets in a cluster).

    ``metrics_port``: where it serves ``/metrics`` (every process gets its own; 0: none).
    """
    spec = layout.job.spec
    node = layout.node_of(role, index)
    env = build_pod_env(
        role,
        job_name=layout.job.name,
        coordinator_addr=layout.coordinator_addr,
        shm_dir=str(layout.shm_dir(node)),
        run_dir=str(layout.run_dir),
        job_config=str(layout.job_file),
        weight_port=layout.ports.weights[index if role is Role.TRAIN else 0],
        metrics_port=metrics_port,
        token_file=str(layout.token_file),
        listen_host=layout.node_host(node),
        train=TrainRendezvous(
            world_size=spec.trainer.replicas,
            backend=spec.resolved_backend(cuda_available=_cuda_available()).value,
            master_addr=layout.netns[0].address if layout.netns else "127.0.0.1",
            master_port=layout.ports.master,
            weight_data_port=0,  # the kernel picks it; receivers learn it over gRPC
        )
        if role is Role.TRAIN
        else None,
        identity=PodIdentity(
            namespace=LOCAL_NAMESPACE,
            replica_index=index,
            pod_name=layout.pod_name(role, index),
            node_name=layout.node_name(node),
        ),
    )
    if layout.netns:  # gloo cannot find a namespace's interface from its host name
        env["GLOO_SOCKET_IFNAME"] = layout.netns[node].interface
    return env


def _cuda_device_count() -> int:
    return int(torch.cuda.device_count()) if _cuda_available() else 0


def _cuda_available() -> bool:
    return bool(torch.cuda.is_available())


@dataclass
class Proc:
    """One running "pod"."""

    name: str
    role: Role
    index: int
    popen: subprocess.Popen[bytes]
    log_path: Path
    started_at: float
    restarts: int = 0
    stopping: bool = False
    metrics_port: int = 0


@dataclass
class Outcome:
    code: int
    message: str = ""
    failure: Failure | None = None  # why, when a process failed: exception, message, the policy's frame


def last_failure(proc: Proc) -> Failure | None:
    """The failure in the traceback ``proc`` printed since it was last started (None if it printed none)."""
    try:
        text = proc.log_path.read_text(errors="replace")
    except OSError:
        return None
    marker = f"==== {proc.name} started at "
    return failure_from_log(text[text.rfind(marker) :] if marker in text else text, pod=proc.name)


def disk_fault_line(log_path: Path) -> str | None:
    """The one-line reason a pod printed before it exited on a disk fault (``... disk fault: ...``)."""
    for line in reversed(tail(log_path, lines=50).splitlines()):
        if MARK in line:
            return line.removeprefix("rlkube pod: ")
    return None


@dataclass
class Supervisor:
    """Starts, watches, restarts and stops the processes of one local run."""

    layout: Layout
    command: list[str] = field(default_factory=lambda: [sys.executable, "-m", "rlkube.launch.pod"])
    base_env: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    train: dict[int, Proc] = field(default_factory=dict)
    evals: dict[int, Proc] = field(default_factory=dict)
    desired_evaluators: int = 0
    restart_ledger: RestartLedger = field(default_factory=RestartLedger)
    eval_restarts: int = 0
    started_at: datetime | None = None
    _eval_retry_at: dict[int, float] = field(default_factory=dict)
    _eval_crash_loop: dict[int, int] = field(default_factory=dict)  # consecutive failures: the back-off
    _eval_failures: dict[int, int] = field(default_factory=dict)  # restarts per eval replica
    spares: dict[int, Proc] = field(default_factory=dict)  # warm standbys by rank (--standby)

    @property
    def train_restarts(self) -> int:
        """Restarts of the train group, as ``runPolicy.backoffLimit`` counts them."""
        return self.restart_ledger.group_restarts

    # -------------------------------------------------------------- starting
    def prepare(self) -> None:
        """Directories, control file; a run or checkpoint directory that takes no file is a DiskFault."""
        check_writable(self.layout.run_dir, what="run directory")
        check_writable(RunPaths(self.layout.run_dir).checkpoints, what="checkpoint directory")
        self.layout.run_dir.mkdir(parents=True, exist_ok=True)
        (self.layout.run_dir / "logs").mkdir(exist_ok=True)
        if not self.layout.token_file.exists():  # rlkube run writes a fresh one before starting us
            write_token_file(self.layout.token_file, new_token())
        sweep_stale_shm_roots(self.layout.shm_root.parent)
        for node in range(self.layout.nodes):
            self.layout.shm_dir(node).mkdir(parents=True, exist_ok=True)
        (self.layout.shm_root / SUPERVISOR_PID_FILE).write_text(f"{os.getpid()}\n")
        self.desired_evaluators = self.layout.job.spec.evaluator.replicas
        self.write_control(self.desired_evaluators)
        self.started_at = datetime.now(UTC)

    def start_train_group(self) -> None:
        for rank in range(self.layout.job.spec.trainer.replicas):
            spare = self.spares.pop(rank, None)
            alive = spare is not None and spare.popen.poll() is None
            if spare is not None and alive and standby_can_go(self._ready_file(rank), spare.popen.pid):
                self.train[rank] = self._activate(spare, restarts=self.train_restarts)
                continue
            if spare is not None:  # it has not even started Python yet: a fresh start is as quick
                self.stop_processes([spare], grace=0)
            self.train[rank] = self._spawn(Role.TRAIN, rank, restarts=self.train_restarts)

    def keep_standbys(self) -> None:
        """``--standby``: one warm standby per train rank (a dead one is replaced)."""
        if not self.layout.standby:
            return
        for rank in range(self.layout.job.spec.trainer.replicas):
            spare = self.spares.get(rank)
            if spare is None or spare.popen.poll() is not None:
                self.spares[rank] = self._spawn(Role.TRAIN, rank, standby=True)

    def _ready_file(self, rank: int) -> Path:
        return self.layout.shm_root / f"standby-rank-{rank}.ready"

    def _activate(self, spare: Proc, *, restarts: int) -> Proc:
        """The standby becomes the rank (SIGUSR1); its log says so, as a fresh start's would."""
        self._ready_file(spare.index).unlink(missing_ok=True)
        with spare.log_path.open("ab") as log:
            log.write(f"==== {spare.name} started at {time.strftime('%H:%M:%S')} (restart {restarts}, "
                      "a warm standby)\n".encode())  # fmt: skip
        os.kill(spare.popen.pid, signal.SIGUSR1)
        spare.started_at, spare.restarts = time.monotonic(), restarts
        return spare

    def _spawn(self, role: Role, index: int, restarts: int = 0, *, standby: bool = False) -> Proc:
        name = self.layout.pod_name(role, index)
        log_path = self.layout.run_dir / "logs" / f"{name}.log"
        metrics_port = free_port()  # one per process: locally every "pod" shares the host
        env = {**self.base_env, **pod_env(self.layout, role, index, metrics_port=metrics_port)}
        # Health on any free port: the "pods" share one host (and no kubelet probes them).
        env[HEALTH_PORT_ENV] = "0"
        if role is Role.TRAIN:  # each rank its own GPU, as the device plugin gives each pod its own
            gpu = visible_gpu_for_rank(
                index, parent_visible=self.base_env.get("CUDA_VISIBLE_DEVICES"), count=_cuda_device_count()
            )
            if gpu is not None:
                env["CUDA_VISIBLE_DEVICES"] = gpu
        started = time.strftime("%H:%M:%S")
        header = f"{name} started at {started} (restart {restarts})"
        if standby:
            env[STANDBY_ENV] = str(self._ready_file(index))
            header = f"a standby of {name} started at {started} (waits until it is needed)"
        command = [*self.layout.exec_prefix(role, index), *self.command]
        popen = spawn(command, env, log_path, header=header)
        return Proc(name, role, index, popen, log_path, time.monotonic(), restarts, metrics_port=metrics_port)

    # -------------------------------------------------------------- control
    def complete_marker(self) -> Path:
        return RunPaths(self.layout.run_dir).checkpoints / COMPLETE_FILE

    def control_path(self) -> Path:
        return self.layout.run_dir / CONTROL_FILE

    def write_control(self, evaluators: int) -> None:
        write_control(self.layout.run_dir, evaluators)

    def read_control(self) -> int:
        try:
            value = json.loads(self.control_path().read_text()).get("evaluators", self.desired_evaluators)
            return max(0, int(value))
        except (OSError, ValueError, TypeError):
            return self.desired_evaluators

    def reconcile_evaluators(self, now: float) -> None:
        """Start missing eval workers (respecting restart back-off) and drain surplus ones."""
        self.desired_evaluators = self.read_control()
        for index in sorted(self.evals, reverse=True):
            proc = self.evals[index]
            if index >= self.desired_evaluators and not proc.stopping:
                proc.stopping = True
                _signal(proc, signal.SIGTERM)
        for index in range(self.desired_evaluators):
            if index in self.evals or now < self._eval_retry_at.get(index, 0.0):
                continue
            self.evals[index] = self._spawn(Role.EVAL, index, restarts=self._eval_failures.get(index, 0))

    # -------------------------------------------------------------- watching
    def poll(self, now: float) -> Outcome | None:
        """One supervision step; an Outcome when the run is over."""
        for index, proc in list(self.evals.items()):
            code = proc.popen.poll()
            if code is None:
                continue
            del self.evals[index]
            if proc.stopping:
                continue
            failures = self._eval_failures[index] = self._eval_failures.get(index, 0) + 1
            limit = self.layout.job.spec.run_policy.eval_backoff_limit
            if run_policy.backoff_exceeded(failures, limit) and not self.complete_marker().exists():
                failure = last_failure(proc)
                return Outcome(
                    1,
                    f"{run_policy.eval_backoff_message(proc.name, failures, limit)} (last exit code {code})."
                    f"\n--- last lines of {proc.log_path}:\n{tail(proc.log_path)}",
                    failure,
                )
            self.eval_restarts += 1
            ran_for = now - proc.started_at
            in_a_row = EVAL_BACKOFF.failures_after_exit(self._eval_crash_loop.get(index, 0), ran_for)
            self._eval_crash_loop[index] = in_a_row
            self._eval_retry_at[index] = now + EVAL_BACKOFF.delay(in_a_row)
        if self.complete_marker().exists():
            return Outcome(0)
        recorded = read_failure(self.complete_marker().parent)
        if recorded is not None:
            return Outcome(1, f"the job failed: {recorded['message']}")
        deadline = self.layout.job.spec.run_policy.active_deadline_seconds
        if deadline is not None and run_policy.is_due(self.started_at, deadline, datetime.now(UTC)):
            return Outcome(1, run_policy.deadline_message(deadline))
        # Train ranks never exit on their own before the marker exists: any exit is a failure.
        failed = [p for p in self.train.values() if p.popen.poll() is not None]
        if failed:
            culprit = failed[0]
            if culprit.popen.returncode == EXIT_DISK_FAULT:  # a restart would meet the same disk
                return Outcome(1, disk_fault_line(culprit.log_path) or f"{culprit.name}: {MARK} see its log")
            limit = self.layout.job.spec.run_policy.backoff_limit
            ledger = self.restart_ledger.group_restarted(self.layout.job.spec.trainer.replicas)
            if run_policy.backoff_exceeded(ledger.group_restarts, limit):
                lines = tail(culprit.log_path)
                return Outcome(
                    1,
                    f"{culprit.name} exited with code {culprit.popen.returncode}; "
                    f"{run_policy.backoff_message(ledger.group_restarts, limit)}."
                    f"\n--- last lines of {culprit.log_path}:\n{lines}",
                    last_failure(culprit),
                )
            self.restart_ledger = ledger
            self.stop_processes(list(self.train.values()))
            self.train.clear()
            self.start_train_group()
        self.reconcile_evaluators(now)
        self.keep_standbys()
        self.write_cluster_file()
        return None

    def describe(self) -> dict[str, object]:
        """What ``cluster.json`` says: where the coordinator is and which process is which pod."""
        return {
            "coordinator": self.layout.coordinator_addr,
            "token_file": str(self.layout.token_file),
            "shm_root": str(self.layout.shm_root),
            "desired_evaluators": self.desired_evaluators,
            "train_restarts": self.train_restarts,
            "eval_restarts": self.eval_restarts,
            "standby": {p.name: p.popen.pid for p in self.spares.values() if p.popen.poll() is None},
            "standby_ready": sorted(
                p.name
                for p in self.spares.values()
                if standby_is_ready(self._ready_file(p.index), p.popen.pid)
            ),
            "pods": {
                p.name: {
                    "pid": p.popen.pid,
                    "role": p.role.value,
                    "index": p.index,
                    "restarts": p.restarts,
                    "metrics": f"http://{self._metrics_host(p)}:{p.metrics_port}{contract.METRICS_PATH}",
                }
                for p in self.all_procs()
                if p.popen.poll() is None
            },
        }

    def _metrics_host(self, proc: Proc) -> str:
        return (
            self.layout.netns[self.layout.node_of(proc.role, proc.index)].address
            if self.layout.netns
            else "127.0.0.1"
        )

    def write_cluster_file(self) -> None:
        text = json.dumps(self.describe(), indent=1)
        if text != getattr(self, "_cluster_text", None):
            path = self.layout.run_dir / CLUSTER_FILE
            tmp = path.with_suffix(".tmp")
            tmp.write_text(text)
            tmp.replace(path)
            self._cluster_text = text

    # -------------------------------------------------------------- stopping
    def stop_processes(self, procs: list[Proc], *, grace: float = GRACE_SECONDS) -> None:
        for proc in procs:
            proc.stopping = True
            _signal(proc, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in procs:
            remaining = max(0.0, deadline - time.monotonic())
            try:
                proc.popen.wait(timeout=remaining)
            except subprocess.TimeoutExpired:
                _signal(proc, signal.SIGKILL)
                proc.popen.wait()

    def shutdown(self, *, grace: float = GRACE_SECONDS) -> None:
        # Standbys (idle), eval workers (they drain into a live coordinator), then the train ranks.
        self.stop_processes(list(self.spares.values()), grace=0)  # idle, nothing to save
        self.spares.clear()
        self.stop_processes(list(self.evals.values()), grace=grace)
        self.evals.clear()
        self.stop_processes(list(self.train.values()), grace=grace)
        self.train.clear()
        shutil.rmtree(self.layout.shm_root, ignore_errors=True)
        (self.layout.run_dir / CLUSTER_FILE).unlink(missing_ok=True)

    def all_procs(self) -> list[Proc]:
        return [*self.train.values(), *self.evals.values()]


#: In each run's shm root: the pid of the supervisor that owns it.
SUPERVISOR_PID_FILE = "supervisor.pid"


def sweep_stale_shm_roots(parent: Path) -> list[Path]:
    """Remove the shm roots of local runs whose supervisor is gone (it was killed with SIGKILL).

    Only directories holding a ``supervisor.pid`` of a process that no longer exists are
    removed; anything else under ``parent`` is left alone. Returns what was removed.
    """
    removed = []
    for pid_file in parent.glob(f"rlkube-*/{SUPERVISOR_PID_FILE}"):
        try:
            pid = int(pid_file.read_text().strip())
        except (OSError, ValueError):
            continue
        if pid <= 0 or _alive(pid):
            continue
        shutil.rmtree(pid_file.parent, ignore_errors=True)
        removed.append(pid_file.parent)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def _signal(proc: Proc, sig: signal.Signals) -> None:
    signal_group(proc.popen.pid, sig)


def supervise(
    supervisor: Supervisor,
    *,
    on_tick: Callable[[Supervisor], None] | None = None,
    interval: float = 0.5,
) -> Outcome:
    """Run until the job finishes, fails, or the user interrupts; always shuts everything down."""
    interrupted: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        interrupted.append(signum)

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        supervisor.prepare()
        supervisor.start_train_group()
        while not interrupted:
            outcome = supervisor.poll(time.monotonic())
            if outcome is not None:
                return outcome
            if on_tick is not None:
                on_tick(supervisor)
            time.sleep(interval)
        return Outcome(130, "interrupted: stopped every process")
    except OSError as exc:  # the supervisor's own writes (logs, cluster.json) on a full disk
        if not is_disk_error(exc):
            raise
        return Outcome(1, describe(exc))
    except DiskFault as exc:
        return Outcome(1, str(exc))
    finally:
        supervisor.shutdown()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
