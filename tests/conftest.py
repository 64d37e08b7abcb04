"""Shared fixtures. Test modules are grouped by behaviour (spec/, policy/, weights/, operator/, ...)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

MINIMAL_JOB: dict[str, Any] = {
    "apiVersion": "rlkube.io/v1alpha1",
    "kind": "RLJob",
    "metadata": {"name": "cartpole"},
    "spec": {"env": {"id": "CartPole-v1"}},
}


@pytest.fixture
def minimal_job() -> dict[str, Any]:
    """The smallest valid RLJob manifest (a fresh copy per test)."""
    return copy.deepcopy(MINIMAL_JOB)
