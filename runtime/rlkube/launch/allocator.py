"""Large buffers stay in the heap: glibc told not to mmap and munmap one for every fragment.

I/O (process-wide). A pod that moves fragments of tens of MB (an Atari fragment is 58 MB) allocates
and frees buffers of that size for each one: gRPC's receive buffer and the message's bytes on rank
0, the encoded message on an eval worker. glibc serves every allocation above its mmap threshold
(32 MB at most, whatever it has learnt) with a fresh ``mmap`` and gives it back with ``munmap``, so
each fragment's buffers are page-faulted in anew: measured here, copying 58 MB into a warm buffer
took 9 ms and into a fresh one 44 ms, and a bare ``grpc.aio`` server spent 105 ms of CPU receiving
a 58 MB message, 51 ms with the buffers kept (docs/performance.md, "Large buffers kept").

:func:`keep_large_buffers_in_heap` sets ``M_MMAP_MAX`` to 0 (every allocation from the heap),
``M_TRIM_THRESHOLD`` to 1 GiB (freed memory is kept for the next fragment rather than returned) and
``M_ARENA_MAX`` to 1: a thread's own arena is a heap of at most 64 MB, so a 58 MB buffer asked for
on one of gRPC's threads failed there and was retried in the main one (with one arena the eval
workers' encoding cost per Atari fragment was 39-65 ms, with the heap alone 62-83, before 75-122).
The price is that a pod's resident memory stays at its high-water mark, which a pod holding a
buffer of such fragments reaches anyway. Nothing is changed off glibc, or when ``GLIBC_TUNABLES``
already sets a ``glibc.malloc`` tunable: that is the operator's own choice (and the way to opt out,
e.g. ``GLIBC_TUNABLES=glibc.malloc.mmap_max=65536``).
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform
from collections.abc import Mapping

logger = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1  # glibc's <malloc.h>
M_MMAP_MAX = -4
M_ARENA_MAX = -8
TRIM_THRESHOLD_BYTES = 1 << 30


def keep_large_buffers_in_heap(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether glibc now keeps large buffers in the heap (see the module docstring). Call it early."""
    if "glibc.malloc." in environ.get("GLIBC_TUNABLES", ""):
        return False
    if platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the process's own C library
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    kept = all(
        mallopt(option, value) == 1
        for option, value in ((M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES), (M_ARENA_MAX, 1))
    )
    if not kept:
        logger.warning("glibc refused mallopt: large buffers are mapped and unmapped for each use")
    return kept
