"""GPU paths, measured: NCCL backend selection, the CUDA copy mode of the weight plane, a 2-rank DDP step.

Run by ``benchmarks/gpu_check.sh`` (``make gpu-check``). On a machine without CUDA, or with
``RLKUBE_GPU_CHECK_CPU=1``, every section runs its CPU fallback and says so, so the script is
tested here. Each section prints ``key=value`` figures; a section that fails prints ``FAIL`` and
the run exits 1 after the others ran.

1. ``backend``: what ``spec.trainer.backend: auto`` resolves to (the operator's and the launcher's
   rule), whether NCCL is available, its version, the devices.
2. ``weights``: a model of ``--mb`` MB on the device; the trainer's publish (device -> pinned host
   staging -> shm slot, as the weight plane packs a CUDA state dict) and an eval policy's copy
   mode (shm slot -> device shadow), checked byte for byte, with GB/s per stage.
3. ``ddp``: two ranks, one DDP step of an MLP: NCCL on two GPUs, gloo with both ranks on one GPU
   (NCCL refuses two ranks on one device), gloo on CPU without CUDA.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

FORCE_CPU_ENV = "RLKUBE_GPU_CHECK_CPU"


def cuda_usable() -> bool:
    return os.environ.get(FORCE_CPU_ENV, "") not in ("1", "true") and torch.cuda.is_available()


def report(section: str, **figures: object) -> None:
    print(f"[{section}] " + " ".join(f"{k}={v}" for k, v in figures.items()), flush=True)


def timed(fn: Callable[[], object], *, sync: bool, repeat: int = 5) -> float:
    """Best of ``repeat`` runs, seconds (CUDA work synchronised)."""
    best = float("inf")
    for _ in range(repeat):
        if sync:
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if sync:
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best


# ------------------------------------------------------------------------------- 1. backend
def check_backend() -> None:
    from rlkube.spec import parse_job

    cuda = cuda_usable()
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
    devices = torch.cuda.device_count() if cuda else 0
    name = torch.cuda.get_device_name(0) if devices else "cpu"
    report(
        "backend",
        resolved=resolved,
        nccl_available=nccl,
        nccl_version=version,
        gpus=devices,
        device=repr(name),
    )
    expected = "nccl" if cuda else "gloo"
    if resolved != expected:
        raise AssertionError(f"backend auto resolved to {resolved}, expected {expected}")


# ------------------------------------------------------------------------------- 2. weights
def model_state(megabytes: int, device: torch.device) -> dict[str, dict[str, torch.Tensor]]:
    """``{module: {param: tensor}}`` of about ``megabytes`` MB in 8 float32 tensors."""
    per_tensor = max(1, megabytes * (1 << 20) // 4 // 8)
    generator = torch.Generator(device="cpu").manual_seed(0)
    return {"model": {f"w{i}": torch.randn(per_tensor, generator=generator).to(device) for i in range(8)}}


def check_weights(megabytes: int) -> None:
    from rlkube.weights.copies import copy_slot_into_shadow
    from rlkube.weights.publisher import PublisherConfig, WeightPublisher
    from rlkube.weights.shm_reader import ShmReader

    cuda = cuda_usable()
    device = torch.device("cuda:0" if cuda else "cpu")
    state = model_state(megabytes, device)
    nbytes = sum(t.numel() * t.element_size() for p in state.values() for t in p.values())
    flat = torch.cat([t.flatten() for t in state["model"].values()])
    pinned = torch.empty(flat.numel(), dtype=flat.dtype, pin_memory=cuda)
    to_host = timed(lambda: pinned.copy_(flat, non_blocking=cuda), sync=cuda)  # device -> pinned host
    with tempfile.TemporaryDirectory(prefix="rlkube-gpu-check-", dir=_shm_root()) as tmp:
        shm_dir = Path(tmp)
        with WeightPublisher(PublisherConfig(shm_dir=shm_dir)) as publisher:
            publisher.send(state)  # first touch of the slots' pages
            publisher.send(state)
            publish = timed(lambda: publisher.send(state), sync=cuda)  # device -> (host) -> shm
            with ShmReader(shm_dir, verify=True) as reader, reader.acquire() as snap:
                shadow = torch.empty(snap.buffer.numel(), dtype=torch.uint8, device=device)
                to_device = timed(
                    lambda: copy_slot_into_shadow(shadow, snap.buffer), sync=cuda
                )  # shm -> device
                views = {name: view.to(device) for name, view in snap.views["model"].items()}
                exact = all(torch.equal(views[name], tensor) for name, tensor in state["model"].items())
                shadow_exact = torch.equal(shadow.cpu(), snap.buffer)
    gb = nbytes / 1e9
    report(
        "weights",
        mode="cuda" if cuda else "cpu-fallback",
        mb=round(nbytes / 1e6, 1),
        device_to_pinned_ms=round(1e3 * to_host, 2),
        device_to_pinned_gbps=round(gb / to_host, 2),
        publish_ms=round(1e3 * publish, 2),
        publish_gbps=round(gb / publish, 2),
        shm_to_device_ms=round(1e3 * to_device, 2),
        shm_to_device_gbps=round(gb / to_device, 2),
        exact=exact and shadow_exact,
    )
    if not (exact and shadow_exact):
        raise AssertionError("the weights read back on the device differ from the trainer's")


def _shm_root() -> str | None:
    return "/dev/shm" if Path("/dev/shm").is_dir() else None


# ------------------------------------------------------------------------------- 3. ddp
def _ddp_rank(rank: int, world: int, port: int, backend: str, device_kind: str, result: Path) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group(backend, rank=rank, world_size=world)
    try:
        if device_kind == "cuda":
            gpu = rank % torch.cuda.device_count()
            torch.cuda.set_device(gpu)
            device = torch.device("cuda", gpu)
        else:
            device = torch.device("cpu")
        torch.manual_seed(0)  # the same initial weights on every rank (DDP broadcasts rank 0's anyway)
        model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.Tanh(), torch.nn.Linear(1024, 2)).to(
            device
        )
        ids = [device.index] if device.type == "cuda" else None
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)
        optimizer = torch.optim.Adam(ddp.parameters(), lr=1e-3)
        rows = 512 if device.type == "cuda" else 64  # the CPU fallback checks the path, not the speed
        data = torch.randn(rows, 256, generator=torch.Generator().manual_seed(rank)).to(device)

        def step() -> None:
            optimizer.zero_grad()
            ddp(data).square().mean().backward()  # gradients all-reduced across the ranks
            optimizer.step()

        sync = device.type == "cuda"
        step()  # warm-up: buckets, NCCL communicators
        seconds = timed(step, sync=sync, repeat=10 if sync else 3)
        flat = torch.cat([p.detach().flatten() for p in model.parameters()])
        gathered = [torch.empty_like(flat) for _ in range(world)]
        dist.all_gather(gathered, flat)
        agree = all(torch.equal(gathered[0], g) for g in gathered)
        if rank == 0:
            result.write_text(f"{seconds} {int(agree)}\n")
    finally:
        dist.destroy_process_group()


def check_ddp() -> None:
    from rlkube.launch.local import free_port

    gpus = torch.cuda.device_count() if cuda_usable() else 0
    if gpus >= 2:
        backend, device_kind, note = "nccl", "cuda", "nccl, one GPU per rank"
    elif gpus == 1:
        backend, device_kind, note = (
            "gloo",
            "cuda",
            "gloo fallback: both ranks share one GPU (NCCL refuses that)",
        )
    else:
        backend, device_kind, note = "gloo", "cpu", "cpu fallback: no CUDA"
    with tempfile.TemporaryDirectory(prefix="rlkube-gpu-check-") as tmp:
        result = Path(tmp) / "rank0.txt"
        mp.start_processes(
            _ddp_rank,
            args=(2, free_port(), backend, device_kind, result),
            nprocs=2,
            join=True,
            start_method="spawn",
        )
        seconds, agree = result.read_text().split()
    report(
        "ddp",
        ranks=2,
        backend=backend,
        device=device_kind,
        step_ms=round(1e3 * float(seconds), 2),
        ranks_agree=agree == "1",
        note=repr(note),
    )
    if agree != "1":
        raise AssertionError("the two DDP ranks hold different weights after the step")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=256, help="model size of the weight-plane check (MB)")
    args = parser.parse_args(argv)
    print(
        f"torch {torch.__version__}, cuda {'yes' if cuda_usable() else 'no'}"
        + (f" ({FORCE_CPU_ENV}=1)" if os.environ.get(FORCE_CPU_ENV) else ""),
        flush=True,
    )
    failed = []
    for name, run in (
        ("backend", check_backend),
        ("weights", lambda: check_weights(args.mb)),
        ("ddp", check_ddp),
    ):
        try:
            run()
        except Exception:
            traceback.print_exc()
            print(f"[{name}] FAIL", flush=True)
            failed.append(name)
    print("gpu check: " + ("all passed" if not failed else f"FAILED: {', '.join(failed)}"), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
