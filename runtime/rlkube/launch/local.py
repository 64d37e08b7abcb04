"""``rlkube run`` as a local cluster: train ranks and eval workers as processes, like pods.

Every process gets exactly the env contract a pod gets (``rlkube.contract``), with the values a
cluster would fill in: pod and node names, the coordinator's address, one shm directory per
simulated node. The supervisor then behaves like the StatefulSet controller plus the operator:

- an eval worker that dies is started again (a pod restarts); one scaled away gets SIGTERM and
  drains; the eval count follows ``control.json`` in the run directory (``rlkube scale``);
- a train rank that fails takes the whole train group down and up again: every rank resumes
  from the newest checkpoint, at most ``runPolicy.backoffLimit`` times;
- the job is finished when rank 0 writes the completion marker (``checkpoints/COMPLETE.json``,
  as in a pod every rank then idles until stopped): everything is stopped.

Ctrl-C (or SIGTERM) stops every process (SIGTERM, then SIGKILL after the grace period) and
removes the shm directories. A failure exits non-zero with the failing process's last lines.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rlkube import contract
from rlkube.contract import Role
from rlkube.engine.checkpoint import COMPLETE_FILE
from rlkube.engine.failure import read_failure
from rlkube.engine.run_paths import RunPaths
from rlkube.security.credential import new_token, write_token_file
from rlkube.spec import RLJob

_PR_SET_PDEATHSIG = 1


def _load_prctl() -> Callable[..., int] | None:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl  # type: ignore[no-any-return]
    except (OSError, AttributeError):  # not Linux: Ctrl-C and SIGTERM still stop every "pod"
        return None


# Resolved once, here: the child calls it between fork and exec, where nothing should be loaded.
_prctl = _load_prctl()


def _die_with_supervisor() -> None:
    """In each "pod" before exec: SIGTERM when the supervisor dies, even by SIGKILL.

    The pods run in sessions of their own (so a terminal's Ctrl-C reaches only the supervisor,
    which stops them in order); without this, a killed supervisor would leave them running.
    """
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


CONTROL_FILE = "control.json"
#: Written by the supervisor while it runs: the coordinator's address and every "pod" with its pid.
CLUSTER_FILE = "cluster.json"
LOCAL_NAMESPACE = "local"
#: Seconds a process gets between SIGTERM and SIGKILL (eval workers drain in this time).
GRACE_SECONDS = 20.0
#: An eval worker that keeps dying is restarted after this many seconds at most (doubling from 0.5).
MAX_RESTART_DELAY = 10.0


def write_control(run_dir: Path, evaluators: int) -> None:
    """Set the desired eval worker count of the local run in ``run_dir`` (atomically)."""
    path = run_dir / CONTROL_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"evaluators": evaluators}))
    tmp.replace(path)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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


def pod_env(layout: Layout, role: Role, index: int) -> dict[str, str]:
    """The env contract for one local "pod" (the same names render.py sets in a cluster)."""
    spec = layout.job.spec
    node = layout.node_of(role, index)
    env = {
        "RLKUBE_JOB_NAME": layout.job.name,
        "RLKUBE_NAMESPACE": LOCAL_NAMESPACE,
        "RLKUBE_ROLE": role.value,
        "RLKUBE_REPLICA_INDEX": str(index),
        "RLKUBE_POD_NAME": layout.pod_name(role, index),
        "RLKUBE_NODE_NAME": layout.node_name(node),
        "RLKUBE_COORDINATOR_ADDR": f"127.0.0.1:{layout.ports.coordinator}",
        "RLKUBE_SHM_DIR": str(layout.shm_dir(node)),
        "RLKUBE_RUN_DIR": str(layout.run_dir),
        "RLKUBE_JOB_CONFIG": str(layout.job_file),
        "RLKUBE_WEIGHT_PORT": str(layout.ports.weights[index if role is Role.TRAIN else 0]),
        "RLKUBE_TOKEN_FILE": str(layout.token_file),
        "RLKUBE_LISTEN_HOST": layout.listen_host,
    }
    if role is Role.TRAIN:
        world = spec.trainer.replicas
        env |= {
            "RLKUBE_BACKEND": spec.resolved_backend(cuda_available=_cuda_available()).value,
            "WORLD_SIZE": str(world),
            "RANK": str(index),
            "LOCAL_RANK": "0",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(layout.ports.master),
            "PET_NNODES": str(world),
            "PET_NPROC_PER_NODE": "1",
            "PET_NODE_RANK": str(index),
            "PET_MASTER_ADDR": "127.0.0.1",
            "PET_MASTER_PORT": str(layout.ports.master),
        }
    return env


def _cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:  # pragma: no cover - torch is a dependency
        return False


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


@dataclass
class Outcome:
    code: int
    message: str = ""


def tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


@dataclass
class Supervisor:
    """Starts, watches, restarts and stops the processes of one local run."""

    layout: Layout
    command: list[str] = field(default_factory=lambda: [sys.executable, "-m", "rlkube.launch.pod"])
    base_env: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    train: dict[int, Proc] = field(default_factory=dict)
    evals: dict[int, Proc] = field(default_factory=dict)
    desired_evaluators: int = 0
    train_restarts: int = 0
    eval_restarts: int = 0
    _eval_retry_at: dict[int, float] = field(default_factory=dict)
    _eval_backoff: dict[int, float] = field(default_factory=dict)

    # -------------------------------------------------------------- starting
    def prepare(self) -> None:
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

    def start_train_group(self) -> None:
        for rank in range(self.layout.job.spec.trainer.replicas):
            self.train[rank] = self._spawn(Role.TRAIN, rank, restarts=self.train_restarts)

    def _spawn(self, role: Role, index: int, restarts: int = 0) -> Proc:
        name = self.layout.pod_name(role, index)
        log_path = self.layout.run_dir / "logs" / f"{name}.log"
        env = {**self.base_env, **pod_env(self.layout, role, index)}
        # One process per "pod" on a shared machine: one intra-op thread each unless told otherwise.
        env.setdefault("OMP_NUM_THREADS", "1")
        env.setdefault("PYTHONUNBUFFERED", "1")
        with log_path.open("ab") as log:
            log.write(f"==== {name} started at {time.strftime('%H:%M:%S')} (restart {restarts})\n".encode())
            popen = subprocess.Popen(
                self.command,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_supervisor,
            )
        return Proc(name, role, index, popen, log_path, time.monotonic(), restarts)

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
            self.evals[index] = self._spawn(
                Role.EVAL, index, restarts=int(self._eval_backoff.get(index, 0) > 0)
            )

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
            self.eval_restarts += 1
            delay = min(MAX_RESTART_DELAY, max(0.5, 2 * self._eval_backoff.get(index, 0.25)))
            if now - proc.started_at > 60:
                delay = 0.5  # it ran fine for a while: restart promptly
            self._eval_backoff[index] = delay
            self._eval_retry_at[index] = now + delay
        if self.complete_marker().exists():
            return Outcome(0)
        failure = read_failure(self.complete_marker().parent)
        if failure is not None:
            return Outcome(1, f"the job failed: {failure['message']}")
        # Train ranks never exit on their own before the marker exists: any exit is a failure.
        failed = [p for p in self.train.values() if p.popen.poll() is not None]
        if failed:
            culprit = failed[0]
            limit = self.layout.job.spec.run_policy.backoff_limit
            if self.train_restarts >= limit:
                lines = tail(culprit.log_path)
                return Outcome(
                    1,
                    f"{culprit.name} exited with code {culprit.popen.returncode}; "
                    f"backoff limit {limit} reached.\n--- last lines of {culprit.log_path}:\n{lines}",
                )
            self.train_restarts += 1
            self.stop_processes(list(self.train.values()))
            self.train.clear()
            self.start_train_group()
        self.reconcile_evaluators(now)
        self.write_cluster_file()
        return None

    def describe(self) -> dict[str, object]:
        """What ``cluster.json`` says: where the coordinator is and which process is which pod."""
        return {
            "coordinator": f"127.0.0.1:{self.layout.ports.coordinator}",
            "token_file": str(self.layout.token_file),
            "shm_root": str(self.layout.shm_root),
            "desired_evaluators": self.desired_evaluators,
            "train_restarts": self.train_restarts,
            "eval_restarts": self.eval_restarts,
            "pods": {
                p.name: {"pid": p.popen.pid, "role": p.role.value, "index": p.index, "restarts": p.restarts}
                for p in self.all_procs()
                if p.popen.poll() is None
            },
        }

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
        # Eval workers first (they drain into a live coordinator), then the train ranks.
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
    try:
        os.killpg(proc.popen.pid, sig)
    except ProcessLookupError:
        pass


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
    finally:
        supervisor.shutdown()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
