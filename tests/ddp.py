"""Gloo ranks in spawned processes for tests, torn down without racing gloo's worker threads.

A gloo worker thread drops its finished work (and the Python tensors it holds) a moment after the
waiting rank has moved on. If the rank's interpreter is already finalizing by then, the thread
that wants the GIL is ended mid-destructor and the process aborts ("terminate called without an
active exception", SIGABRT) although every collective succeeded. A DDP module keeps the process
group alive past ``destroy_process_group``, so the group's threads are never joined before exit.
``leave_process_group`` frees those holders first; destroying the group then joins its threads
(torch releases the GIL for that), so the rank exits only after they are done.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp


def leave_process_group() -> None:
    """Free what still holds the default group (DDP modules of a finished body), then destroy it."""
    gc.collect()
    dist.destroy_process_group()


def spawn_ranks(body: Callable[..., None], world: int, tmp_path: Path, *args: Any) -> None:
    """Run ``body(rank, world, *args)`` on ``world`` gloo ranks; raise if any rank fails.

    A file store has no owner: with a TCP store, rank 0 exiting first (it hosts the store) could
    abort rank 1 mid-teardown on a loaded machine. No port to pick, either.
    """
    store = tmp_path / "gloo-store"
    mp.spawn(_run_rank, args=(body, world, str(store), args), nprocs=world, join=True)


def _run_rank(rank: int, body: Callable[..., None], world: int, store: str, args: tuple[Any, ...]) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        body(rank, world, *args)
        dist.barrier()  # neither rank tears down while the other still talks
    finally:
        leave_process_group()
