"""The GPU acceptance check: the product on one GPU machine, in one run, with one table at the end.

Run by ``benchmarks/gpu_check.sh`` (``make gpu-check``). Sections, each with its own time bound
(a section past it fails and the next one runs):

=============  =======  ===================================================================
section        bound    what
=============  =======  ===================================================================
packages       -        every Python package the check needs, by pip name (stops if the
                        runtime's are missing; HalfCheetah's MuJoCo is checked in its section)
backend        30 s     ``trainer.backend: auto`` resolved; NCCL's version; the GPUs
placement      90 s     more NCCL train ranks than GPUs: ``rlkube run`` refuses before
                        anything starts, naming ``--set spec.trainer.replicas=N``
weights-<MB>   120 s    the weight plane in CUDA mode (``weights_check``): publish and load
                        GB/s beside the ``copy_`` ceilings, byte for byte; 100 MB and 1 GB
cartpole       240 s    ``rlkube run examples/cartpole.yaml`` with 1 train rank on the GPU,
                        to its target return
halfcheetah    2x150 s  HalfCheetah-v5, 8 eval workers, ``--epochs`` epochs: env steps/s
                        with the learner on the GPU, then with CUDA hidden
checkpoint     2x150 s  a GPU learner checkpoints, is SIGKILLed, and resumes
ddp            150 s    2 train ranks over NCCL, one GPU each (skipped with one GPU)
=============  =======  ===================================================================

Without CUDA, or with ``RLKUBE_GPU_CHECK_CPU=1``, every section runs its CPU fallback on tiny
sizes (``tests/bench/test_gpu_check.py`` runs it); CUDA is then hidden from the runs too.
Exit status: 0 when no section failed, 1 otherwise, 2 when packages are missing.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from benchmarks.gpu.packages import MUJOCO, RUNTIME, describe_missing, missing

FORCE_CPU_ENV = "RLKUBE_GPU_CHECK_CPU"
SECTIONS = ("backend", "placement", "weights", "cartpole", "halfcheetah", "checkpoint", "ddp")


@dataclass
class Outcome:
    name: str
    result: str  # PASS | FAIL | SKIP
    seconds: float
    figures: dict[str, Any] = field(default_factory=dict)
    note: str = ""


def forced_cpu() -> bool:
    return os.environ.get(FORCE_CPU_ENV, "") in ("1", "true")


@contextlib.contextmanager
def bounded(seconds: float) -> Iterator[None]:
    """Raise TimeoutError in the main thread after ``seconds`` (subprocess runs also bound themselves)."""

    def expire(signum: int, frame: Any) -> None:
        raise TimeoutError(f"section ran past its {seconds:.0f} s bound")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_section(name: str, bound: float, fn: Callable[[], dict[str, Any]]) -> Outcome:
    from benchmarks.gpu.product import Skipped

    start = time.monotonic()
    try:
        with bounded(bound):
            figures = fn()
    except Skipped as exc:
        outcome = Outcome(name, "SKIP", time.monotonic() - start, note=str(exc))
        print(f"[{name}] SKIP reason={str(exc)!r}", flush=True)
        return outcome
    except Exception as exc:
        traceback.print_exc()
        print(f"[{name}] FAIL", flush=True)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return Outcome(name, "FAIL", time.monotonic() - start, note=f"{type(exc).__name__}: {first}")
    print(f"[{name}] " + " ".join(f"{k}={v}" for k, v in figures.items()), flush=True)
    return Outcome(name, "PASS", time.monotonic() - start, figures)


# ------------------------------------------------------------------------------- backend
def check_backend(*, cuda: bool) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from rlkube.spec import parse_job

    job = parse_job(
        {
            "apiVersion": "rlkube.io/v1alpha1",
            "kind": "RLJob",
            "metadata": {"name": "gpu-check"},
            "spec": {"policy": {"type": "PPO"}, "env": {"id": "CartPole-v1"}},
        }
    )
    resolved = job.spec.resolved_backend(cuda_available=cuda).value
    nccl = dist.is_nccl_available()
    version = ".".join(map(str, torch.cuda.nccl.version())) if nccl and cuda else "-"
    gpus = torch.cuda.device_count() if cuda else 0
    name = torch.cuda.get_device_name(0) if gpus else "cpu"
    expected = "nccl" if cuda else "gloo"
    if resolved != expected:
        raise AssertionError(f"backend auto resolved to {resolved}, expected {expected}")
    return {
        "resolved": resolved,
        "nccl_available": nccl,
        "nccl_version": version,
        "gpus": gpus,
        "device": repr(name),
    }


def table(outcomes: list[Outcome]) -> str:
    """The one table the check ends with: a row per section, its figures or why it failed."""
    rows = [("section", "result", "seconds", "figures")]
    for o in outcomes:
        detail = " ".join(f"{k}={v}" for k, v in o.figures.items()) if o.figures else o.note
        rows.append((o.name, o.result, f"{o.seconds:.1f}", detail))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = [f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:>{widths[2]}}  {r[3]}" for r in rows]
    rule = "-" * min(120, max(len(line) for line in lines))
    return "\n".join([rule, lines[0], rule, *lines[1:], rule])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--mb", type=int, nargs="+", default=None, help="weight-plane model sizes in MB (default 100 1024)"
    )
    parser.add_argument("--epochs", type=int, default=10, help="HalfCheetah epochs per run (default 10)")
    parser.add_argument("--only", nargs="+", choices=SECTIONS, default=None, help="run these sections only")
    args = parser.parse_args(argv)
    # gpu_check.sh's `timeout` sends SIGTERM: unwind, so the runs in progress are killed (their
    # launchers run in sessions of their own and would outlive this process otherwise).
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))
    lacking = missing(RUNTIME)
    if lacking:
        print(
            "gpu check: this interpreter lacks packages rlkube needs:\n" + describe_missing(lacking),
            flush=True,
        )
        return 2
    import torch

    small = forced_cpu() or not torch.cuda.is_available()
    if forced_cpu():
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the runs this check starts must not see a GPU either
    cuda = not small
    gpus = torch.cuda.device_count() if cuda else 0
    print(
        f"python {sys.version.split()[0]}, torch {torch.__version__}, "
        f"cuda {'yes' if cuda else 'no'}, gpus {gpus}"
        + (f" ({FORCE_CPU_ENV}=1: CPU fallbacks)" if forced_cpu() else ""),
        flush=True,
    )
    from benchmarks.gpu import product
    from benchmarks.gpu.weights_check import check_weights

    sizes = args.mb or ([4] if small else [100, 1024])
    wanted = set(args.only or SECTIONS)
    ws = product.Workspace()
    plan: list[tuple[str, str, float, Callable[[], dict[str, Any]]]] = [
        ("backend", "backend", 30, lambda: check_backend(cuda=cuda)),
        ("placement", "placement", 90, lambda: product.placement(ws, gpus=gpus, small=small)),
        *[("weights", f"weights-{mb}", 120, lambda mb=mb: check_weights(mb, cuda=cuda)) for mb in sizes],
        ("cartpole", "cartpole", 250, lambda: product.cartpole(ws, small=small)),
        ("halfcheetah", "halfcheetah", 320, lambda: product.halfcheetah(ws, small=small, epochs=args.epochs)),
        ("checkpoint", "checkpoint", 320, lambda: product.checkpoint(ws, small=small)),
        ("ddp", "ddp", 160, lambda: product.ddp(ws, gpus=gpus, small=small)),
    ]
    lacking_mujoco = missing(MUJOCO)
    if lacking_mujoco and not small:
        print(
            "gpu check: the halfcheetah section will fail:\n" + describe_missing(lacking_mujoco), flush=True
        )
    mujoco = "present" if not lacking_mujoco else "missing:" + ",".join(p.pip for p in lacking_mujoco)
    outcomes = [Outcome("packages", "PASS", 0.0, {"runtime": "all present", "mujoco": mujoco})]
    try:
        for section, name, bound, fn in plan:
            if section in wanted:
                outcomes.append(run_section(name, bound, fn))
    finally:
        ws.close()
    failed = [o.name for o in outcomes if o.result == "FAIL"]
    print(table(outcomes), flush=True)
    print("gpu check: " + ("all passed" if not failed else f"FAILED: {', '.join(failed)}"), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
