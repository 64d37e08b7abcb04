"""Fixtures for the tests against the real control plane (``control_plane`` in tests/conftest.py)."""

from __future__ import annotations

import itertools
import json
import subprocess
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from tests.conftest import delete_namespace
from tests.operator.harness import kubectl

if TYPE_CHECKING:
    from rlkube_devcluster.controlplane.cluster import ControlPlane

_NAMESPACES = itertools.count()


class Kube:
    """kubectl as cluster-admin against the real API server, in one namespace."""

    def __init__(self, plane: ControlPlane, namespace: str) -> None:
        self.plane = plane
        self.namespace = namespace

    def __call__(
        self, *args: str, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return kubectl(self.plane.kubeconfig, "-n", self.namespace, *args, input=input, check=check)

    def apply(self, document: dict[str, Any] | str, *extra: str) -> subprocess.CompletedProcess[str]:
        """``kubectl apply`` as a user types it (kubectl's default, strict, validation); not checked."""
        text = document if isinstance(document, str) else yaml.safe_dump(document)
        return self("apply", *extra, "-f", "-", input=text, check=False)

    def get(self, kind: str, name: str) -> dict[str, Any] | None:
        result = self("get", kind, name, "-o", "json", check=False)
        return json.loads(result.stdout) if result.returncode == 0 else None


@pytest.fixture
def kube(control_plane: ControlPlane) -> Iterator[Kube]:
    """kubectl in a fresh namespace of its own, deleted after the test."""
    name = f"t{next(_NAMESPACES)}"
    kubectl(control_plane.kubeconfig, "create", "namespace", name)
    yield Kube(control_plane, name)
    delete_namespace(control_plane.kubeconfig, name)
