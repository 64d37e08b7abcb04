from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.security.live import LiveJob, live_job


@pytest.fixture
def live() -> Iterator[LiveJob]:
    yield from live_job()
