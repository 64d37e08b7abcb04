"""The fault tests start local clusters the way tests/runtime does (same fixture)."""

from tests.runtime.conftest import local_run

__all__ = ["local_run"]
