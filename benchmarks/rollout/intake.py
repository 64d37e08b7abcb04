"""``rlkube bench intake``: the trajectory plane's ceiling, with no env, no policy and no learner.

N producer processes push synthetic fragments into a real coordinator (train rank 0's
``Coordinator`` and ``CoordinatorServer``, with the job's credential, the edge checks against the
env's spaces and the acknowledgement journal on disk) as fast as the wire allows, through the
eval worker's own transport (``rlkube.engine.task_stream.TaskStream``, as every ``EvalWorker``
uses it). Rank 0 runs the async engine's intake loop: it takes every step's
fragments from the buffer (``Coordinator.wait_batch``) and, with ``--train-us-per-step``, holds
the GIL that long per env step, as a small learner does.

Fragments are the size the real rollout sends: ``cartpole`` (8 envs x 32 steps, float32[4]
observations, the keys PPO writes: ~11 KB on the wire) and ``atari`` (8 envs x 128 steps,
uint8[4, 84, 84] observations and next observations: ~58 MB). It reports, per producer count,
fragments/s and env steps/s acknowledged by rank 0, rank 0's CPU time per fragment (over the
measured window) and the producers' (over their whole run: encoding and sending): the intake
ceiling, independent of env and learner speed. ``rlkube bench rollout`` prints it beside
its rows as the ceiling column.

Rank 0 and the producers are separate processes (``--role``), so a profiler can attach to each:
``py-spy record --pid PID`` (``--pause-for-profiler`` prints the pids and waits).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from rlkube.data.fragment import Fragment
from rlkube.data.spaces import TrajectorySpaces
from rlkube.launch.allocator import keep_large_buffers_in_heap
from tensordict import TensorDict


@dataclass(frozen=True)
class Shape:
    """What one fragment looks like: its envs, steps, and the env's spaces."""

    name: str
    num_envs: int
    steps: int
    observation_space: gym.Space[Any]
    action_space: gym.Space[Any]


SHAPES: dict[str, Shape] = {
    "cartpole": Shape(
        "cartpole",
        8,
        32,
        gym.spaces.Box(-4.8, 4.8, (4,), np.float32),
        gym.spaces.Discrete(2),
    ),
    "atari": Shape(
        "atari",
        8,
        128,
        gym.spaces.Box(0, 255, (4, 84, 84), np.uint8),
        gym.spaces.Discrete(4),
    ),
}


def synthetic_fragment(shape: Shape, *, seed: int = 0) -> Fragment:
    """A fragment with the keys PPO's rollout writes, its values inside the env's spaces."""
    generator = torch.Generator().manual_seed(seed)
    rows, steps = shape.num_envs, shape.steps
    obs_shape = tuple(shape.observation_space.shape or ())
    if shape.observation_space.dtype == np.uint8:
        obs = torch.randint(0, 256, (rows, steps, *obs_shape), dtype=torch.uint8, generator=generator)
    else:
        obs = torch.rand((rows, steps, *obs_shape), generator=generator)
    n = int(getattr(shape.action_space, "n", 2))
    data = TensorDict(
        {
            "observation": obs,
            "next_observation": obs.clone(),
            "action": torch.randint(0, n, (rows, steps), generator=generator),
            "log_prob": -torch.rand((rows, steps), generator=generator),
            "value": torch.rand((rows, steps), generator=generator),
            "reward": torch.ones((rows, steps)),
            "terminated": torch.zeros((rows, steps), dtype=torch.bool),
            "truncated": torch.zeros((rows, steps), dtype=torch.bool),
        },
        batch_size=[rows, steps],
    )
    return Fragment(data=data, episode_returns=(20.0,), episode_lengths=(20,), weight_version=0)


def spaces_of(shape: Shape) -> TrajectorySpaces:
    return TrajectorySpaces.of(shape.observation_space, shape.action_space, action_bounds=True)


def bench_job(shape: Shape, *, producers: int, steps_per_epoch: int) -> Any:
    from rlkube.spec import parse_job

    return parse_job(
        {
            "apiVersion": "rlkube.io/v1alpha1",
            "kind": "RLJob",
            "metadata": {"name": f"bench-intake-{shape.name}-{producers}"},
            "spec": {
                "engine": "async",
                "policy": {"type": "PPO"},
                "env": {"id": "CartPole-v1", "numEnvs": shape.num_envs},
                "train": {
                    "maxEpochs": 1_000_000,
                    "stepsPerEpoch": steps_per_epoch,
                    "fragmentLength": shape.steps,
                    "batchSize": min(steps_per_epoch, 256),
                    "evalInterval": 0,
                    "saveInterval": 0,
                },
                "buffer": {"capacity": 2 * max(1, steps_per_epoch // (shape.num_envs * shape.steps))},
                "evaluator": {"replicas": producers},
                "log": {"tensorboard": False},
            },
        }
    )


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _hold_gil(seconds: float) -> None:
    """A learner's step as the intake threads see it: pure Python, holding the GIL throughout."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


# ---------------------------------------------------------------------------------------- rank 0
def slow_syncs(seconds: float) -> None:
    """Make every ``os.fsync`` and ``os.fdatasync`` in this process take at least ``seconds``, as
    on a network block volume; the wait releases the GIL, as a real sync does."""

    def slowed(real: Callable[[int], None]) -> Callable[[int], None]:
        def sync(fd: int) -> None:
            start = time.perf_counter()
            real(fd)
            left = seconds - (time.perf_counter() - start)
            if left > 0:
                time.sleep(left)

        return sync

    os.fsync, os.fdatasync = slowed(os.fsync), slowed(os.fdatasync)


def run_rank0(args: argparse.Namespace) -> int:
    from rlkube.coordinator.journal import JOURNAL_DIR, AckJournal
    from rlkube.coordinator.service import CoordinatorServer
    from rlkube.coordinator.state import Coordinator

    shape = SHAPES[args.shape]
    if args.sync_ms > 0:
        slow_syncs(args.sync_ms * 1e-3)
    job = bench_job(shape, producers=args.producers, steps_per_epoch=args.steps_per_epoch)
    coordinator = Coordinator(job)
    coordinator.spaces = spaces_of(shape)
    if not args.no_journal:
        coordinator.journal = AckJournal(
            Path(args.run_dir) / "checkpoints" / JOURNAL_DIR, incarnation=coordinator.incarnation
        ).open()
    server = CoordinatorServer(coordinator, address="127.0.0.1:0").start()
    Path(args.port_file).write_text(str(server.port))
    coordinator.open_stream(min_version=0)
    train_per_step = args.train_us_per_step * 1e-6
    marks: dict[str, tuple[float, float, int, int]] = {}
    step = 0

    def mark(name: str) -> None:
        progress = coordinator.progress
        marks[name] = (time.perf_counter(), _cpu_seconds(), progress.fragments, progress.env_steps)

    started = time.perf_counter()
    try:
        while True:
            now = time.perf_counter() - started
            if "start" not in marks and now >= args.warmup and coordinator.progress.fragments > 0:
                mark("start")
            if "start" in marks and now >= args.warmup + args.seconds:
                mark("end")
                break
            if now > args.warmup + args.seconds + 60:
                break
            batch = coordinator.wait_batch(timeout=0.5, step=step)
            if batch is None:
                continue
            step += 1
            if train_per_step:
                _hold_gil(train_per_step * batch.env_steps)
    finally:
        coordinator.finish()
        result: dict[str, Any] = {"producers": coordinator.live_workers()}
        if "start" in marks and "end" in marks:
            (t0, c0, f0, s0), (t1, c1, f1, s1) = marks["start"], marks["end"]
            seconds = t1 - t0
            fragments = f1 - f0
            result.update(
                seconds=seconds,
                fragments=fragments,
                env_steps=s1 - s0,
                fragments_per_second=fragments / seconds,
                env_steps_per_second=(s1 - s0) / seconds,
                rank0_cpu_ms_per_fragment=1e3 * (c1 - c0) / fragments if fragments else None,
                rank0_cpu_share=(c1 - c0) / seconds,
            )
        Path(args.result).write_text(json.dumps(result))
        time.sleep(0.5)  # producers hear STOP
        server.stop(grace=1.0)
    return 0


# ---------------------------------------------------------------------------------------- producer
def run_producer(args: argparse.Namespace) -> int:
    from rlkube._proto import policy_group_pb2 as pb
    from rlkube.coordinator.client import CoordinatorError, PolicyGroupClient
    from rlkube.coordinator.wire import encode_fragment
    from rlkube.engine.task_stream import TaskStream

    shape = SHAPES[args.shape]
    fragment = synthetic_fragment(shape, seed=args.index)
    port = _wait_for_port(Path(args.port_file))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with PolicyGroupClient(f"127.0.0.1:{port}") as client:
        reply = client.register(
            pb.RegisterRequest(role="eval", pod_name=f"producer-{args.index}", num_envs=shape.num_envs),
            retry_for=30.0,
        )
        acknowledged = 0

        def count(_message: Any, ack: Any) -> None:
            nonlocal acknowledged
            acknowledged += ack is not None and ack.accepted

        # rank 0 stops serving at the end
        stream = TaskStream(client, stop=stop, retry_for=5.0, on_answer=count)
        stream.bind(reply.worker_id)
        cpu_at_start = _cpu_seconds()
        try:
            while not stop.is_set():
                task = stream.next_task(wait_seconds=5.0)
                if task.kind == pb.Task.STOP:
                    break
                if task.kind != pb.Task.COLLECT:
                    continue
                # Encoded per push, as the worker does (the tensors' copy into the request).
                message = encode_fragment(
                    fragment,
                    task_id=task.task_id,
                    worker_id=reply.worker_id,
                    epoch=task.epoch,
                    lease_next=True,
                )
                stream.push(message)
        except CoordinatorError:
            pass
        finally:
            stream.close()
            if args.result:
                cpu = _cpu_seconds() - cpu_at_start
                Path(args.result).write_text(json.dumps({"cpu_seconds": cpu, "acknowledged": acknowledged}))
    return 0


def _wait_for_port(path: Path, timeout: float = 120.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text():
            return int(path.read_text())
        time.sleep(0.05)
    raise TimeoutError(f"rank 0 wrote no port to {path} in {timeout:.0f} s")


# ---------------------------------------------------------------------------------------- driver
def measure(args: argparse.Namespace, producers: int, root: Path) -> dict[str, Any]:
    """One run: rank 0 and ``producers`` producer processes; rank 0's figures."""
    run_dir = Path(tempfile.mkdtemp(prefix=f"intake-{producers}-", dir=root))
    port_file, result = run_dir / "port", run_dir / "result.json"
    common = [
        "--shape",
        args.shape,
        "--port-file",
        str(port_file),
        "--producers",
        str(producers),
        "--steps-per-epoch",
        str(args.steps_per_epoch),
    ]
    module = [sys.executable, "-m", "benchmarks.rollout.intake"]
    rank0_args = [
        "--role",
        "rank0",
        "--run-dir",
        str(run_dir),
        "--result",
        str(result),
        "--seconds",
        str(args.seconds),
        "--warmup",
        str(args.warmup),
        "--train-us-per-step",
        str(args.train_us_per_step),
        "--sync-ms",
        str(args.sync_ms),
        *(["--no-journal"] if args.no_journal else []),
    ]
    rank0 = subprocess.Popen([*module, *rank0_args, *common])
    producer_results = [run_dir / f"producer-{i}.json" for i in range(producers)]
    workers = [
        subprocess.Popen(
            [*module, "--role", "producer", "--index", str(i), "--result", str(producer_results[i]), *common]
        )
        for i in range(producers)
    ]
    if args.pause_for_profiler:
        pids = " ".join(str(p.pid) for p in workers)
        print(f"rank 0 pid {rank0.pid}; producer pids {pids}", file=sys.stderr, flush=True)
    try:
        rank0.wait(timeout=args.warmup + args.seconds + 180)
        for worker in workers:
            worker.wait(timeout=30)
    except subprocess.TimeoutExpired:
        print("intake: a process did not finish in time; stopped", file=sys.stderr)
    finally:
        for process in (rank0, *workers):
            if process.poll() is None:
                process.kill()
                process.wait()
    row = json.loads(result.read_text()) if result.exists() else {}
    row.update(producer_cost(producer_results))
    return {
        "method": "intake",
        "shape": args.shape,
        "producers": producers,
        "journal": not args.no_journal,
        "sync_ms": args.sync_ms,
        "train_us_per_step": args.train_us_per_step,
        **row,
    }


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def producer_cost(results: list[Path]) -> dict[str, Any]:
    """The producers' CPU per fragment acknowledged, over their whole run (rank 0's is over the window)."""
    cpu = acknowledged = 0.0
    for path in results:
        if path.exists():
            one = json.loads(path.read_text())
            cpu += one["cpu_seconds"]
            acknowledged += one["acknowledged"]
    return {"producer_cpu_ms_per_fragment": 1e3 * cpu / acknowledged} if acknowledged else {}


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        f"{'shape':8s} {'producers':>9s} {'journal':>7s} {'sync ms':>7s} {'train us/step':>13s} "
        f"{'fragments/s':>11s} {'env steps/s':>11s} {'rank 0 cpu ms/frag':>18s} {'rank 0 cpu':>10s} "
        f"{'producer cpu ms/frag':>20s}"
    ]
    for r in rows:
        cpu = r.get("rank0_cpu_ms_per_fragment")
        lines.append(
            f"{r['shape']:8s} {r['producers']:9d} {'on' if r['journal'] else 'off':>7s} "
            f"{r.get('sync_ms', 0.0):7.1f} {r['train_us_per_step']:13.0f} "
            f"{r.get('fragments_per_second', 0):11,.1f} "
            f"{r.get('env_steps_per_second', 0):11,.0f} {_ms(cpu):>18s} "
            f"{100 * r.get('rank0_cpu_share', 0):9.0f}% {_ms(r.get('producer_cpu_ms_per_fragment')):>20s}"
        )
    return "\n".join(lines)


def ceiling(*, shape: str = "cartpole", producers: int = 2, seconds: float = 5.0) -> dict[str, Any]:
    """The intake ceiling for ``rlkube bench rollout``'s ceiling column: one short run."""
    args = parser().parse_args(["--shape", shape, "--seconds", str(seconds)])
    args.train_us_per_step = 0.0
    with tempfile.TemporaryDirectory(prefix="rlkube-bench-intake-") as tmp, job_credential(Path(tmp)):
        return measure(args, producers, Path(tmp))


@contextmanager
def job_credential(root: Path) -> Iterator[None]:
    """A per-job token for rank 0 and the producers (the credential every real job's calls carry)."""
    from rlkube.security.credential import TOKEN_FILE_ENV, new_token, write_token_file

    before = os.environ.get(TOKEN_FILE_ENV)
    os.environ[TOKEN_FILE_ENV] = str(write_token_file(root / "token", new_token()))
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(TOKEN_FILE_ENV, None)
        else:
            os.environ[TOKEN_FILE_ENV] = before


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rlkube bench intake", description=__doc__.split("\n\n")[0])
    p.add_argument("--role", choices=["driver", "rank0", "producer"], default="driver")
    p.add_argument("--shape", choices=sorted(SHAPES), default="cartpole")
    p.add_argument("--producers", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--seconds", type=float, default=10.0, help="measured window")
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--steps-per-epoch", type=int, default=2048, help="env steps per engine step")
    p.add_argument(
        "--train-us-per-step",
        type=float,
        nargs="+",
        default=[0.0],
        help="rank 0 holds the GIL this long per env step taken (0: training off)",
    )
    p.add_argument("--no-journal", action="store_true", help="no acknowledgement journal (not a real job)")
    p.add_argument(
        "--sync-ms",
        type=float,
        default=0.0,
        help="every fsync on rank 0 takes at least this long (a network block volume: 1-10 ms)",
    )
    p.add_argument("--pause-for-profiler", action="store_true", help="print the pids (attach py-spy)")
    p.add_argument("--json", type=Path, default=None)
    # internal (the rank 0 and producer processes)
    p.add_argument("--index", type=int, default=0)
    p.add_argument("--port-file", default="")
    p.add_argument("--run-dir", default="")
    p.add_argument("--result", default="")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.role in ("rank0", "producer"):
        keep_large_buffers_in_heap()  # as a pod does (rlkube.launch.pod)
    if args.role == "rank0":
        args.producers = args.producers[0]
        args.train_us_per_step = args.train_us_per_step[0]
        return run_rank0(args)
    if args.role == "producer":
        return run_producer(args)
    rows = []
    with tempfile.TemporaryDirectory(prefix="rlkube-bench-intake-") as tmp, job_credential(Path(tmp)):
        root = Path(tmp)
        train_values = list(args.train_us_per_step)
        for train in train_values:
            for producers in args.producers:
                one = argparse.Namespace(**{**vars(args), "train_us_per_step": train})
                print(f"intake: {producers} producer(s), training {train:.0f} us/step...", file=sys.stderr)
                rows.append(measure(one, producers, root))
    print(table(rows))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
