"""rlkube.launch.allocator: a pod's large buffers are reused from the heap, not faulted in anew.

Counted, not timed: a process that allocates, touches and frees a 64 MB buffer six times takes
one page fault per page of it with the buffers kept, six without (each one a fresh mmap).
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest
from rlkube.launch.allocator import keep_large_buffers_in_heap

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")

FAULTS = """
import resource, sys
from rlkube.launch.allocator import keep_large_buffers_in_heap
kept = keep_large_buffers_in_heap() if sys.argv[1] == "keep" else False
size = 64 * 2**20
start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(6):
    buffer = bytearray(size)
    buffer[::4096] = b"\\x01" * (size // 4096)
    del buffer
print(kept, (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start) / (size // 4096))
"""


def faults_per_page(mode: str, **env: str) -> tuple[bool, float]:
    result = subprocess.run(
        [sys.executable, "-c", FAULTS, mode],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    kept, faults = result.stdout.split()
    return kept == "True", float(faults)


def test_kept_buffers_are_faulted_in_once_not_for_every_use() -> None:
    assert faults_per_page("keep") == (True, pytest.approx(1.0, abs=0.3))
    assert faults_per_page("default") == (False, pytest.approx(6.0, abs=0.5))


def test_an_operators_own_malloc_tunables_win() -> None:
    kept, faults = faults_per_page("keep", GLIBC_TUNABLES="glibc.malloc.mmap_max=65536")
    assert not kept
    assert faults == pytest.approx(6.0, abs=0.5)
    assert not keep_large_buffers_in_heap({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1"})
