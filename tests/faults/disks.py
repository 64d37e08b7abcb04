"""Small file systems for fault tests: a tmpfs of a few hundred KiB, mounted and unmounted by the test.

Mounting needs root (CAP_SYS_ADMIN); tests that need one are skipped where it is not allowed.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False)


@contextlib.contextmanager
def small_fs(mountpoint: Path, *, size_kib: int, read_only: bool = False) -> Iterator[Path]:
    """A tmpfs of ``size_kib`` at ``mountpoint`` (created), optionally read-only; always unmounted."""
    mountpoint.mkdir(parents=True, exist_ok=True)
    options = f"size={size_kib}k" + (",ro" if read_only else "")
    mounted = _run("mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mountpoint))
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip()})")
    try:
        yield mountpoint
    finally:
        result = _run("umount", str(mountpoint))
        if result.returncode != 0:  # something still has a file open: detach it lazily
            _run("umount", "-l", str(mountpoint))


def fill(directory: Path, *, leave_bytes: int = 0) -> Path:
    """Fill the file system holding ``directory`` until at most ``leave_bytes`` are free."""
    filler = directory / "filler.bin"
    stats = os.statvfs(directory)
    free = stats.f_bavail * stats.f_frsize
    try:
        with filler.open("ab") as handle:
            handle.write(b"\0" * max(0, free - leave_bytes))
            handle.flush()
    except OSError:  # full already: that is what was asked for
        pass
    return filler


def read_only(mountpoint: Path) -> None:
    """Remount ``mountpoint`` read-only (what a full or failing volume often turns into)."""
    result = _run("mount", "-o", "remount,ro", str(mountpoint))
    assert result.returncode == 0, result.stderr
