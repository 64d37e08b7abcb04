"""A local run killed with SIGKILL cannot remove its shm root; the next run on the machine does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from rlkube.launch.local import SUPERVISOR_PID_FILE, sweep_stale_shm_roots


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _root(parent: Path, name: str, pid: int | str | None) -> Path:
    root = parent / name
    (root / "node-0").mkdir(parents=True)
    (root / "node-0" / "slot-0").write_bytes(b"\0" * 64)
    if pid is not None:
        (root / SUPERVISOR_PID_FILE).write_text(f"{pid}\n")
    return root


def test_only_roots_of_dead_supervisors_are_removed(tmp_path: Path) -> None:
    dead = _root(tmp_path, "rlkube-small-dead", _dead_pid())
    live = _root(tmp_path, "rlkube-small-live", os.getpid())
    unowned = _root(tmp_path, "rlkube-bench-other", None)  # not a local run's: never touched
    garbled = _root(tmp_path, "rlkube-small-garbled", "not a pid")
    foreign = _root(tmp_path, "someone-else", _dead_pid())

    assert sweep_stale_shm_roots(tmp_path) == [dead]
    assert not dead.exists()
    assert all(path.exists() for path in (live, unowned, garbled, foreign))
