"""The weight plane in CUDA mode: a GPU publish into the shm slot and a load out of it, beside the ceilings.

I/O (CUDA, shm). For a model of ``megabytes`` MB on the device, in one run:

* the ceilings: torch's own ``copy_`` device -> freshly pinned host memory, and back;
* publish: ``WeightPublisher.send`` of the CUDA state dict until the version is committed for
  local readers (one DMA into the page-locked slot; ``path`` says if it had to stage instead),
  and the whole ``send`` (it also checksums the slot for remote receivers);
* load: an eval policy's copy-mode load, slot -> device (``load_slot_into_device``);

each best of a few, and every byte checked: the slot against the trainer's tensors, the device
copy against the slot. On CPU (the fallback) the same code runs on CPU tensors.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch


def _best(fn: Callable[[], object], *, cuda: bool, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best


def model_state(megabytes: int, device: torch.device) -> dict[str, dict[str, torch.Tensor]]:
    """``{module: {param: tensor}}`` of about ``megabytes`` MB in 8 float32 tensors (random bytes)."""
    per_tensor = max(1, megabytes * (1 << 20) // 4 // 8)
    generator = torch.Generator(device="cpu").manual_seed(megabytes)
    return {"model": {f"w{i}": torch.randn(per_tensor, generator=generator).to(device) for i in range(8)}}


def _shm_root() -> str | None:
    return "/dev/shm" if Path("/dev/shm").is_dir() else None


def check_weights(megabytes: int, *, cuda: bool, repeat: int = 5) -> dict[str, Any]:
    from rlkube.weights.cuda_host import HostRegistrations
    from rlkube.weights.device_copy import load_slot_into_device
    from rlkube.weights.layout import views_of
    from rlkube.weights.publisher import PublisherConfig, WeightPublisher
    from rlkube.weights.shm_reader import ShmReader

    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    state = model_state(megabytes, device)
    nbytes = sum(t.numel() * t.element_size() for p in state.values() for t in p.values())
    flat = torch.cat([t.flatten() for t in state["model"].values()])
    pinned = torch.empty(flat.numel(), dtype=flat.dtype, pin_memory=cuda)
    back = torch.empty_like(flat)
    ceiling_out = _best(lambda: pinned.copy_(flat, non_blocking=cuda), cuda=cuda, repeat=repeat)
    ceiling_in = _best(lambda: back.copy_(pinned, non_blocking=cuda), cuda=cuda, repeat=repeat)
    commits: list[float] = []
    registry = HostRegistrations(read_only=True)
    with tempfile.TemporaryDirectory(prefix="rlkube-gpu-check-", dir=_shm_root()) as tmp:
        shm_dir = Path(tmp)
        with WeightPublisher(PublisherConfig(shm_dir=shm_dir)) as publisher:
            publisher.send(state)  # first touch of both slots' pages (and their registration)
            publisher.send(state)

            def publish() -> None:
                publisher.send(state)
                commits.append(publisher.last_commit_seconds)

            send = _best(publish, cuda=cuda, repeat=repeat)
            path = publisher.device_copy_path or "cpu"
            with ShmReader(shm_dir) as reader, reader.acquire() as snap:
                slot_exact = all(
                    torch.equal(snap.views["model"][name].to(device), tensor)
                    for name, tensor in state["model"].items()
                )
                shadow = torch.empty(snap.buffer.numel(), dtype=torch.uint8, device=device)
                paths: list[str] = []

                def load() -> None:
                    paths.append(
                        load_slot_into_device(shadow, snap.buffer, slot=snap.slot, registrations=registry)
                    )

                load_seconds = _best(load, cuda=cuda, repeat=repeat)
                loaded = views_of(shadow, snap.layout)["model"]
                load_exact = all(torch.equal(loaded[name], tensor) for name, tensor in state["model"].items())
            registry.close()
    publish_seconds = min(commits)
    gb = nbytes / 1e9
    figures = {
        "mb": round(nbytes / 1e6),
        "publish_path": path,
        "load_path": paths[-1],
        "publish_gbps": round(gb / publish_seconds, 1),
        "publish_ms": round(1e3 * publish_seconds, 1),
        "send_with_checksum_ms": round(1e3 * send, 1),
        "load_gbps": round(gb / load_seconds, 1),
        "load_ms": round(1e3 * load_seconds, 1),
        "ceiling_d2h_gbps": round(gb / ceiling_out, 1),
        "ceiling_h2d_gbps": round(gb / ceiling_in, 1),
        "exact": slot_exact and load_exact,
    }
    figures["publish_of_ceiling"] = round(figures["publish_gbps"] / max(figures["ceiling_d2h_gbps"], 1e-9), 2)
    figures["load_of_ceiling"] = round(figures["load_gbps"] / max(figures["ceiling_h2d_gbps"], 1e-9), 2)
    if cuda and megabytes >= 1024:  # the goal for 1 GB on an H200: both at least 40 GB/s
        figures["goal_40gbps"] = (
            "met" if min(figures["publish_gbps"], figures["load_gbps"]) >= 40 else "missed"
        )
    if cuda:
        torch.cuda.empty_cache()  # the sections after this one run their own CUDA processes
    if not figures["exact"]:
        raise AssertionError(f"bytes differ: slot exact={slot_exact}, device load exact={load_exact}")
    return figures
