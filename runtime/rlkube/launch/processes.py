"""Supervising "pods" as local processes: one implementation for ``rlkube run`` and the node agent.

Both run the pod entrypoint as child processes and need the same few things, written once here:
free ports on loopback, the restart back-off of a container that keeps exiting, children that die
with their supervisor, process-group signalling, and a log file per process.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

LOOPBACK = "127.0.0.1"
#: Defaults of every "container" (its own env wins): one intra-op thread per process on a shared
#: machine, and unbuffered output for the logs.
RUNTIME_DEFAULTS = {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
_PR_SET_PDEATHSIG = 1


def free_ports(count: int, host: str = LOOPBACK, *, exclude: Container[int] = ()) -> list[int]:
    """``count`` distinct TCP ports nothing listens on right now, none of them in ``exclude``.

    The OS picks each; all stay bound until the last is picked, so the OS cannot hand out one
    twice. A port picked but not yet listened on is free again for the OS: pass the ports a caller
    still holds unbound as ``exclude`` (two servers on one port both bind it, gRPC setting
    SO_REUSEPORT, and clients then reach either).
    """
    with contextlib.ExitStack() as held:
        ports: list[int] = []
        while len(ports) < count:
            sock = held.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
            if port not in exclude:
                ports.append(port)
        return ports


def free_port(host: str = LOOPBACK, *, exclude: Container[int] = ()) -> int:
    """A TCP port nothing listens on right now (the OS picks it), not one of ``exclude``."""
    return free_ports(1, host, exclude=exclude)[0]


@dataclass(frozen=True)
class RestartBackOff:
    """Delay before restarting after the n-th consecutive exit, doubling up to ``cap``.

    A process that ran for ``reset_after`` seconds before it exited starts over at ``initial``
    (the kubelet's CrashLoopBackOff: 10 s doubling to 5 min, reset after 10 min of running).
    """

    initial: float = 10.0
    cap: float = 300.0
    reset_after: float = 600.0

    @classmethod
    def kubelet(cls, *, speedup: float = 1.0) -> RestartBackOff:
        """The kubelet's figures, each divided by ``speedup`` (20: 0.5 s doubling to 15 s)."""
        if speedup <= 0:
            raise ValueError("speedup must be positive")
        return cls(initial=10.0 / speedup, cap=300.0 / speedup, reset_after=600.0 / speedup)

    def delay(self, failures: int) -> float:
        return min(self.cap, self.initial * 2 ** max(0, failures - 1))

    def failures_after_exit(self, failures: int, ran_for: float) -> int:
        """The consecutive-failure count after a process that ran ``ran_for`` seconds exited."""
        return 1 if ran_for >= self.reset_after else failures + 1


#: The supervisor's pid, set in a child's env so the child can arrange to die with it (a local run).
SUPERVISOR_PID_ENV = "RLKUBE_SUPERVISOR_PID"


def die_with_supervisor(environ: Mapping[str, str]) -> bool:
    """In a child, after exec: SIGTERM when the supervisor that started it dies, even by SIGKILL.

    Done in the child rather than in a ``preexec_fn``, which would make the supervisor run Python
    between fork and exec with its gRPC threads alive. Children run in sessions of their own (so a
    terminal's Ctrl-C reaches only the supervisor, which stops them in order); without this, a
    killed supervisor would leave them running. False when the supervisor is already gone.
    """
    expected = environ.get(SUPERVISOR_PID_ENV)
    if not expected:
        return True
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: Ctrl-C and SIGTERM still stop every child
        return True
    return os.getppid() == int(expected)  # it died before the request: nobody would signal us


def signal_group(pid: int, sig: signal.Signals) -> None:
    """Signal a child's whole process group (a container's processes); gone already is fine."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def spawn(
    command: Sequence[str],
    env: Mapping[str, str],
    log_path: Path,
    *,
    header: str = "",  # a first line for the log, after "==== "
    cwd: Path | None = None,
    die_with_us: bool = True,
) -> subprocess.Popen[bytes]:
    """Start ``command`` in a session of its own, its output appended to ``log_path``.

    ``die_with_us``: the child gets :data:`SUPERVISOR_PID_ENV` and, when it calls
    :func:`die_with_supervisor` (``rlkube pod`` does), dies with this process. No ``preexec_fn``:
    no Python runs between fork and exec, so CPython uses vfork/exec and live gRPC threads are never
    forked into a child. Raises OSError when the command cannot be started (a missing executable).
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        if header:
            log.write(f"==== {header}\n".encode())
            log.flush()
        return subprocess.Popen(
            list(command),
            env={
                **RUNTIME_DEFAULTS,
                **env,
                **({SUPERVISOR_PID_ENV: str(os.getpid())} if die_with_us else {}),
            },
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def tail(path: Path, lines: int = 30) -> str:
    """The last ``lines`` lines of a log file ("" when it cannot be read)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


#: Local runs only (``rlkube run --standby``): a train rank started with this set blocks SIGUSR1,
#: says so in the file named, imports what it needs, says so again, and waits for SIGUSR1 (go:
#: one sent while it still imports waits for it) or SIGTERM (not needed).
STANDBY_ENV = "RLKUBE_STANDBY_FILE"


def _say(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def wait_as_standby(environ: Mapping[str, str], warm_up: Callable[[], None]) -> bool:
    """In a child started as a standby: ``warm_up()``, wait to be needed. True: go on, False: stop."""
    ready = environ.get(STANDBY_ENV)
    if not ready:
        return True
    wanted = {signal.SIGUSR1, signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, wanted)  # from now on a SIGUSR1 waits for us
    _say(Path(ready), f"{os.getpid()} waiting\n")
    warm_up()
    _say(Path(ready), f"{os.getpid()} ready\n")
    received = signal.sigwait(wanted)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, wanted)
    return received == signal.SIGUSR1


def standby_can_go(path: Path, pid: int) -> bool:
    """Whether the standby ``pid`` takes SIGUSR1 as "go" now (it blocked it; it may still import)."""
    try:
        return path.read_text().split()[0] == str(pid)
    except (OSError, IndexError):
        return False


def standby_is_ready(path: Path, pid: int) -> bool:
    """Whether the standby ``pid`` has finished importing (a "go" starts it at once)."""
    try:
        return path.read_text().split() == [str(pid), "ready"]
    except OSError:
        return False
