"""`rlkube run` as a user runs it, from the GPU check: a process group with a time bound.

I/O (processes, files). Each run gets its own run directory; its ``summary.json``, logs and
checkpoints are read back from there. A run past its bound, or one the caller kills on purpose,
loses its whole process group (``start_new_session``), so no pod process outlives the check.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Finished:
    returncode: int
    seconds: float
    run_dir: Path
    output: str

    def summary(self) -> dict[str, Any]:
        path = self.run_dir / "summary.json"
        if not path.is_file():
            raise AssertionError(f"no {path}; the run ended with {self.returncode}:\n{self.tail()}")
        data: dict[str, Any] = json.loads(path.read_text())
        return data

    def tail(self, lines: int = 25) -> str:
        return "\n".join(self.output.splitlines()[-lines:])

    def log(self, pod: str) -> str:
        path = self.run_dir / "logs" / f"{pod}.log"
        return path.read_text(errors="replace") if path.is_file() else ""


def rlkube_command(
    job: Path | str, *, run_dir: Path, overrides: Sequence[str] = (), in_process: bool = False
) -> list[str]:
    """``rlkube run JOB`` with this interpreter, into ``run_dir``, with ``--set`` overrides."""
    command = [sys.executable, "-m", "rlkube.cli", "run", str(job), "--no-progress"]
    command += ["--run-dir", str(run_dir), *(["--in-process"] if in_process else [])]
    for override in overrides:
        command += ["--set", override]
    return command


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's env with the checkout importable (as benchmarks/gpu_check.sh sets it)."""
    env = dict(os.environ)
    paths = [str(ROOT / "runtime"), str(ROOT / "operator"), str(ROOT)]
    env["PYTHONPATH"] = os.pathsep.join([*paths, *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra or {})
    return env


def run(
    command: Sequence[str],
    *,
    run_dir: Path,
    timeout: float,
    env: Mapping[str, str] | None = None,
    until: Callable[[], bool] | None = None,
) -> Finished:
    """Run ``command`` to its end (or ``timeout``: the group is killed and AssertionError raised).

    ``until``: polled while it runs; when it turns true the group is killed with SIGKILL (a crash
    as the kernel makes it, for the resume check) and the run counts as finished.
    """
    log = run_dir.with_suffix(".out")
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with log.open("wb") as out:
        popen = subprocess.Popen(
            list(command),
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(env or child_env()),
            cwd=ROOT,
            start_new_session=True,
        )
        try:
            while popen.poll() is None:
                if time.monotonic() - start > timeout:
                    _kill_group(popen, signal.SIGTERM, grace=10.0)
                    raise AssertionError(
                        f"`{' '.join(command[3:])}` ran past its {timeout:.0f} s bound:\n"
                        + _tail(log.read_text(errors="replace"))
                    )
                if until is not None and until():
                    _kill_group(popen, signal.SIGKILL, grace=0.0)
                    break
                time.sleep(0.2)
        finally:
            if popen.poll() is None:
                _kill_group(popen, signal.SIGKILL, grace=0.0)
    return Finished(popen.wait(), time.monotonic() - start, run_dir, log.read_text(errors="replace"))


def _kill_group(popen: subprocess.Popen[bytes], sig: signal.Signals, *, grace: float) -> None:
    """Signal the launcher's group and every pod it started (pods run in sessions of their own).

    With SIGKILL the pods go first, so none of them gets the clean stop (and the checkpoint) that
    its launcher's death would give it: a crash, as a lost node makes it.
    """
    if sig is signal.SIGKILL:  # frozen first: a launcher must not restart the pods killed below
        with contextlib.suppress(ProcessLookupError):
            os.kill(popen.pid, signal.SIGSTOP)
    pods = descendants(popen.pid)
    if sig is signal.SIGKILL:
        for pid in pods:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(popen.pid, sig)
    try:
        popen.wait(timeout=grace if grace > 0 else 10.0)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(popen.pid, signal.SIGKILL)
        popen.wait(timeout=10.0)
    for pid in pods:  # anything that outlived its launcher
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (read from /proc), deepest last."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parent = int(stat.rpartition(")")[2].split()[1])
        children.setdefault(parent, []).append(int(entry.name))
    found, queue = [], [pid]
    while queue:
        for child in children.get(queue.pop(0), []):
            found.append(child)
            queue.append(child)
    return found


def _tail(text: str, lines: int = 25) -> str:
    return "\n".join(text.splitlines()[-lines:])


DEVICE_LINE = re.compile(r"train rank (\d+): device (\S+)")


def train_devices(finished: Finished, ranks: int, job: str) -> list[str]:
    """The device each train rank logged at start (``rlkube.launch.devices``), rank order."""
    devices = []
    for rank in range(ranks):
        found = DEVICE_LINE.findall(finished.log(f"{job}-train-{rank}"))
        devices.append(found[0][1] if found else "?")
    return devices


def steps_per_second(summary: Mapping[str, Any]) -> float:
    """Env steps per second of training: rank 0's wall time from the first eval worker to the end."""
    seconds = float(summary["wall_seconds"]) - float(summary.get("seconds_to_first_worker") or 0.0)
    return float(summary["env_steps"]) / max(seconds, 1e-9)
