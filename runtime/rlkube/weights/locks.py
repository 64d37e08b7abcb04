"""File locks (flock) with deadlines, and who holds them.

I/O. flock locks belong to an open file description: two ``open()`` calls in one process get
two independent locks, and the kernel drops a process's locks when it dies (even by SIGKILL).
That is why every holder here opens its own descriptor, and why a crashed writer or reader
never leaves a lock behind.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path


class LockTimeout(TimeoutError):
    """A lock was not granted before its deadline; the message names the holders."""


def lock_holders(path: Path) -> list[int]:
    """Pids holding a flock on ``path`` (from /proc/locks; empty where that is unavailable)."""
    try:
        st = os.stat(path)
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return []
    pids = []
    for line in lines:
        fields = line.split()
        if "->" in fields:  # a waiter, not a holder
            continue
        if len(fields) < 6 or fields[1] != "FLOCK":
            continue
        try:
            inode = int(fields[5].rsplit(":", 1)[1])
            pid = int(fields[4])
        except (IndexError, ValueError):
            continue
        if inode == st.st_ino:
            pids.append(pid)
    return sorted(set(pids))


def describe_pids(pids: list[int]) -> str:
    parts = []
    for pid in pids:
        try:
            cmd = (
                Path(f"/proc/{pid}/cmdline")
                .read_bytes()
                .replace(b"\0", b" ")
                .decode(errors="replace")
                .strip()
            )
        except OSError:
            cmd = "?"
        parts.append(f"pid {pid} ({cmd[:80]})")
    return ", ".join(parts) or "unknown processes"


class FileLock:
    """One flock on one file, on a descriptor of its own. Not thread-safe; one owner."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        self.mode = 0  # 0, fcntl.LOCK_SH or fcntl.LOCK_EX

    def _open(self) -> int:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        return self._fd

    def try_acquire(self, mode: int) -> bool:
        try:
            fcntl.flock(self._open(), mode | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        self.mode = mode
        return True

    def acquire(self, mode: int, *, timeout: float | None, what: str = "lock") -> None:
        """Poll for the lock until ``timeout`` seconds passed (None: wait forever)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.0002
        while not self.try_acquire(mode):
            if deadline is not None and time.monotonic() >= deadline:
                holders = lock_holders(self.path)
                raise LockTimeout(
                    f"{what}: {self.path} still held after {timeout:.1f}s by {describe_pids(holders)}"
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.01)

    def release(self) -> None:
        if self._fd is not None and self.mode:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        self.mode = 0

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # also releases the lock
        self._fd = None
        self.mode = 0

    def same_file(self) -> bool:
        """Whether the path still names the file this descriptor locks (not unlinked and replaced)."""
        if self._fd is None:
            return False
        try:
            return os.stat(self.path).st_ino == os.fstat(self._fd).st_ino
        except FileNotFoundError:
            return False
