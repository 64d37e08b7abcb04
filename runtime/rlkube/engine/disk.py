"""Disk faults as errors with one line of reason, never tracebacks.

I/O: :func:`check_writable` writes (and removes) one probe file. A full disk, a quota, a
read-only or unwritable directory are not bugs in rlkube and retrying does not fix them, so they
end a run with :class:`DiskFault`: one line naming what was written where and why, e.g.
``disk fault: cannot write checkpoint /runs/x/checkpoints/ckpt-000004: [Errno 28] No space left
on device``. ``rlkube pod`` exits with :data:`EXIT_DISK_FAULT` after printing that line, and the
local supervisor (``rlkube run``) ends the run with it instead of restarting the train group.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

#: The exit code of a pod that stopped on a disk fault (not retried by the local supervisor).
EXIT_DISK_FAULT = 3
#: Errors of the file system, not of the program: no space, no quota, read-only, no permission.
DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM})
#: What ``rlkube pod`` prints (and the supervisor looks for) before exiting on a disk fault.
MARK = "disk fault:"


class DiskFault(RuntimeError):
    """A write the run needs failed because of the file system; ``str()`` is one line."""

    def __init__(self, what: str, path: str | os.PathLike[str], cause: OSError) -> None:
        reason = cause.strerror or str(cause)
        code = f"[Errno {cause.errno}] " if cause.errno is not None else ""
        super().__init__(f"{MARK} cannot write {what} {path}: {code}{reason}")
        self.path = Path(path)
        self.cause = cause


def is_disk_error(exc: BaseException) -> bool:
    """Is ``exc`` (or what caused it) a file-system refusal rather than a bug?"""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, DiskFault):
            return True
        if isinstance(current, OSError) and current.errno in DISK_ERRNOS:
            return True
        current = current.__cause__ or current.__context__
    return False


def as_disk_fault(exc: BaseException, *, what: str, path: str | os.PathLike[str]) -> DiskFault | None:
    """``exc`` as a :class:`DiskFault` naming ``what`` at ``path``; None when it is not a disk error."""
    if isinstance(exc, DiskFault):
        return exc
    current: BaseException | None = exc
    while current is not None:
        if isinstance(current, OSError) and current.errno in DISK_ERRNOS:
            return DiskFault(what, getattr(current, "filename", None) or path, current)
        current = current.__cause__ or current.__context__
    return None


def check_writable(directory: str | os.PathLike[str], *, what: str) -> Path:
    """Create ``directory`` if needed and prove a file can be written and synced in it.

    Raises :class:`DiskFault` (one line naming ``what`` and the path) when it cannot: a read-only
    mount, missing permissions, or a full disk.
    """
    path = Path(directory)
    probe = path / f".rlkube-write-probe-{os.getpid()}"
    try:
        path.mkdir(parents=True, exist_ok=True)
        with probe.open("wb") as handle:
            handle.write(b"rlkube\n")
            handle.flush()
            os.fsync(handle.fileno())
    except OSError as exc:
        raise DiskFault(what, path, exc) from None
    finally:
        try:
            probe.unlink(missing_ok=True)
        except OSError:
            pass
    return path


#: Less free space than this after a failed write means the write failed for want of space (a
#: library that swallows the errno, as ``torch.save`` to a path does, still reads as disk full).
LOW_SPACE_BYTES = 1 << 20


def out_of_space(directory: str | os.PathLike[str]) -> OSError | None:
    """An ENOSPC error when the file system holding ``directory`` has (almost) no space left."""
    try:
        stats = os.statvfs(directory)
    except OSError:
        return None
    if stats.f_bavail * stats.f_frsize < LOW_SPACE_BYTES:
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(directory))
    return None


def describe(exc: BaseException) -> str:
    """One line for a disk error: the DiskFault's own text, or ``disk fault: <the OSError>``."""
    current: BaseException | None = exc
    while current is not None:
        if isinstance(current, DiskFault):
            return str(current)
        current = current.__cause__ or current.__context__
    return f"{MARK} {exc}"
