"""Shared fixtures. Test modules are grouped by behaviour (spec/, policy/, weights/, operator/, ...)."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from rlkube_devcluster.controlplane.cluster import ControlPlane

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


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """The real Kubernetes control plane (etcd, API server, controller-manager, scheduler), one per run.

    ``make test`` builds its binaries before pytest starts (``make controlplane``); run alone, the
    first use on a machine builds them here.
    """
    from rlkube_devcluster.controlplane.cluster import ControlPlane

    plane = ControlPlane(tmp_path_factory.mktemp("k8s")).start()
    yield plane
    plane.stop()
