from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.runtime.cluster import LocalRun


@pytest.fixture
def local_run(tmp_path: Path) -> Iterator[list[LocalRun]]:
    """Runs started by a test; stopped afterwards, and checked to leave no process or shm behind."""
    runs: list[LocalRun] = []
    yield runs
    for run in runs:
        run.stop()
        assert not run.leftovers(), f"processes left behind: {run.leftovers()}"
        assert not run.shm_root or not Path(run.shm_root).exists(), f"{run.shm_root} left behind"
