"""Weight-plane fixtures: a private shm directory per test (checked for leaks) and helper processes."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

SHM_ROOT = Path("/dev/shm")


@pytest.fixture
def shm_dir() -> Iterator[Path]:
    """A fresh directory under /dev/shm; the test fails if any file is left in it afterwards.

    (Only this directory is checked: other people's processes share /dev/shm on this machine.)
    """
    path = SHM_ROOT / f"rlkube-test-{secrets.token_hex(4)}"
    yield path
    files = (
        sorted(str(p.relative_to(path)) for p in path.rglob("*") if not p.is_dir()) if path.exists() else []
    )
    shutil.rmtree(path, ignore_errors=True)  # empty parent directories a test made are fine
    assert files == [], f"{path} was left behind with {files}"


class Helper:
    """A helper process (``python -m tests.weights.procs ROLE ...``) that speaks JSON lines on stdout."""

    def __init__(self, *args: object) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.weights.procs", *map(str, args)],
            stdout=subprocess.PIPE,
            stdin=subprocess.PIPE,
            text=True,
            env=env,
        )

    def read(self, timeout: float = 60.0) -> dict:
        """The next JSON line the helper prints."""
        assert self.proc.stdout is not None
        import selectors

        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            self.kill()
            raise TimeoutError(f"helper {self.proc.args} printed nothing for {timeout}s")
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"helper {self.proc.args} exited with {self.proc.wait()}")
        return json.loads(line)

    def send(self, message: dict) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message) + "\n")
        self.proc.stdin.flush()

    def wait(self, timeout: float = 60.0) -> int:
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture
def helpers() -> Iterator[list[Helper]]:
    """Start helpers with ``helpers.append(Helper(...))``; all are killed after the test."""
    started: list[Helper] = []
    yield started
    for helper in started:
        helper.kill()
