"""``python -m benchmarks.rollout.profile``: where train rank 0's and an eval worker's time goes.

Issue #24's first ask, for any worker count: runs the rollout bench's job (CartPole PPO, 8 envs per
worker, fragments of 32 steps, batched requests; ``benchmarks.rollout.run.job``) as a local
cluster and, once every eval worker has registered and env steps are flowing, attaches py-spy to
train rank 0 and to eval worker 0 at once for ``--seconds`` (``--nonblocking``: neither is paused),
then stops the run. Prints the env steps/s of that window (rank 0's GetStatus at its start and
end) and each process's samples by stage (:mod:`benchmarks.rollout.stages`, main thread and the
others apart), and keeps the raw profiles in ``--out``.

    python -m benchmarks.rollout.profile --workers 14 --seconds 10 --out runs/profile-14
"""

from __future__ import annotations

import argparse
import json
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from rlkube._proto import policy_group_pb2 as pb
from rlkube.coordinator.client import CoordinatorError, PolicyGroupClient
from rlkube.engine.run_paths import RunPaths
from rlkube.jobfile import dump_job
from rlkube.launch.local import Layout, Ports, Supervisor, supervise
from rlkube.security.credential import Credential, new_token, write_token_file

from benchmarks.rollout.run import job
from benchmarks.rollout.stages import breakdown


class ProfileTaken(Exception):
    """Raised from the supervisor's tick once both profiles are written: the run is stopped."""


@dataclass
class Profiler:
    """A supervisor tick: waits for a steady run, then records rank 0 and worker 0 with py-spy."""

    py_spy: str
    workers: int
    seconds: float
    out: Path
    client: PolicyGroupClient
    recorders: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    window: list[tuple[float, int]] = field(default_factory=list)  # (monotonic, env steps) at start, end

    def tick(self, supervisor: Supervisor) -> None:
        if not self.recorders:
            status = self._status()
            rank0, worker = supervisor.train.get(0), supervisor.evals.get(0)
            if status is None or rank0 is None or worker is None:
                return
            if status.eval_workers < self.workers or status.env_steps == 0:
                return
            self.window.append((time.monotonic(), status.env_steps))
            for name, pid in (("rank0", rank0.popen.pid), ("worker0", worker.popen.pid)):
                self.recorders[name] = self._record(name, pid)
            return
        if any(recorder.poll() is None for recorder in self.recorders.values()):
            return
        status = self._status()
        if status is not None:
            self.window.append((time.monotonic(), status.env_steps))
        raise ProfileTaken

    def _status(self) -> pb.JobStatus | None:
        try:
            return self.client.status(timeout=1.0)
        except CoordinatorError:
            return None

    def _record(self, name: str, pid: int) -> subprocess.Popen[bytes]:
        command = [self.py_spy, "record", "--pid", str(pid), "--duration", f"{self.seconds:g}"]
        command += ["--rate", "100", "--format", "raw", "--threads", "--idle", "--nonblocking"]
        command += ["--output", str(self.out / f"profile-{name}.txt")]
        log = (self.out / f"py-spy-{name}.log").open("wb")
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)


def find_py_spy(given: str | None) -> str:
    """``--py-spy``, else on PATH, beside this interpreter (a venv's bin), or in a ``pip install
    --target`` directory's bin on sys.path."""
    candidates = [given] if given else [shutil.which("py-spy"), str(Path(sys.executable).parent / "py-spy")]
    candidates += [str(Path(entry) / "bin" / "py-spy") for entry in sys.path if entry]
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            return candidate
    raise SystemExit("profile: py-spy not found (pip install py-spy, or --py-spy PATH)")


def report(out: Path, window: list[tuple[float, int]], *, top: int) -> str:
    lines = []
    if len(window) == 2:
        (t0, s0), (t1, s1) = window
        rate = (s1 - s0) / max(t1 - t0, 1e-9)
        lines.append(f"env steps/s while profiled: {rate:,.0f} ({s1 - s0:,} in {t1 - t0:.1f} s)")
    for name in ("rank0", "worker0"):
        path = out / f"profile-{name}.txt"
        if not path.exists():
            log = out / f"py-spy-{name}.log"
            lines.append(
                f"{name}: no profile ({log.read_text().strip() if log.exists() else 'py-spy did not run'})"
            )
            continue
        for group, counter in breakdown(path.read_text().splitlines(), threads=True).items():
            total = sum(counter.values())
            lines.append(f"{name}, {group} thread(s): {total} samples")
            lines += [f"  {100 * count / total:5.1f}%  {stage}" for stage, count in counter.most_common(top)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.rollout.profile", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--engine", choices=["sync", "async"], default="async")
    parser.add_argument("--seconds", type=float, default=10.0, help="how long py-spy records")
    parser.add_argument(
        "--epochs", type=int, default=2000, help="more than the profile needs: it stops the run"
    )
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("runs/profile"))
    parser.add_argument("--py-spy", default=None, help="the py-spy executable")
    parser.add_argument("--top", type=int, default=10)
    args = parser.parse_args(argv)
    py_spy = find_py_spy(args.py_spy)
    args.out.mkdir(parents=True, exist_ok=True)
    spec = job(engine=args.engine, workers=args.workers, epochs=args.epochs, steps_per_epoch=2048)
    with tempfile.TemporaryDirectory(prefix="rlkube-bench-profile-") as tmp:
        paths = RunPaths(Path(tmp) / spec.name).create()
        paths.job.write_text(dump_job(spec))
        layout = Layout(
            job=spec,
            run_dir=paths.run_dir,
            shm_root=Path("/dev/shm") / f"rlkube-bench-profile-{secrets.token_hex(4)}",
            nodes=min(args.nodes, args.workers),
            ports=Ports.allocate(spec.spec.trainer.replicas),
        )
        write_token_file(layout.token_file, new_token())  # as rlkube run does: the status client needs it
        supervisor = Supervisor(layout)
        client = PolicyGroupClient(
            layout.coordinator_addr, credential=Credential.from_file(layout.token_file)
        )
        profiler = Profiler(py_spy, args.workers, args.seconds, args.out, client)
        try:
            outcome = supervise(supervisor, on_tick=profiler.tick, interval=0.2)
        except ProfileTaken:
            outcome = None
        finally:
            client.close()
            for recorder in profiler.recorders.values():
                if recorder.poll() is None:
                    recorder.kill()
                recorder.wait()
    if outcome is not None:
        print(f"profile: the run ended before the profile was taken ({outcome.message}); raise --epochs")
        return 1
    text = report(args.out, profiler.window, top=args.top)
    header = {"workers": args.workers, "engine": args.engine, "seconds": args.seconds}
    print(json.dumps(header))
    print(text)
    (args.out / "breakdown.txt").write_text(json.dumps(header) + "\n" + text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
