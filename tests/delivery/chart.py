"""Helpers for the chart tests: find the tools, render the chart with named value sets, validate objects.

Rendering shells out to the real ``helm`` (installed into the venv by scripts/install_helm.py);
results are cached per value set, so each test module renders each set once.
"""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "rlkube"
RELEASE = "rlkube"
NAMESPACE = "rlkube-system"
#: Kubernetes minor versions every rendered object must be valid for.
KUBERNETES_VERSIONS = tuple(f"1.{minor}" for minor in range(29, 36))


def tool(name: str) -> str:
    """A dev tool from the venv running the tests (or PATH); a clear failure when it is missing."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if not found:
        raise AssertionError(
            f"{name} not found beside {sys.executable} or on PATH: run `make test` (dev set-up)"
        )
    return found


@dataclass(frozen=True)
class ValueSet:
    """A named way of installing the chart: value files and --set overrides."""

    name: str
    files: tuple[str, ...] = ()
    sets: tuple[str, ...] = ()
    set_strings: tuple[str, ...] = ()

    def helm_args(self) -> list[str]:
        args: list[str] = []
        for path in self.files:
            args += ["--values", str(CHART / path)]
        for item in self.sets:
            args += ["--set", item]
        for item in self.set_strings:
            args += ["--set-string", item]
        return args


DEFAULT = ValueSet("default")
NAMESPACED = ValueSet("namespaced", sets=("watchNamespaces={team-a,team-b}",))
GPU = ValueSet("gpu", files=("values-gpu.yaml",))
EVERYTHING = ValueSet(
    "everything-on",
    files=("values-gpu.yaml",),
    sets=(
        "watchNamespaces={team-a}",
        "metrics.serviceMonitor.enabled=true",
        "metrics.serviceMonitor.labels.release=prometheus",
        "networkPolicy.enabled=true",
        "networkPolicy.metricsFrom[0].namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name=monitoring",
        "image.digest=sha256:" + "0" * 64,
        "imagePullSecrets[0].name=regcred",
        "serviceAccount.annotations.owner=ml-platform",
        "operator.logLevel=debug",
        "operator.extraArgs={--verbose}",
        "operator.extraEnv[0].name=RLKUBE_STATUS_INTERVAL",
        "operator.podAnnotations.team=rl",
        "operator.podLabels.tier=control",
        "operator.priorityClassName=system-cluster-critical",
        "operator.nodeSelector.kubernetes\\.io/os=linux",
        "operator.tolerations[0].key=CriticalAddonsOnly",
        "operator.tolerations[0].operator=Exists",
    ),
    set_strings=("metrics.service.annotations.prometheus\\.io/scrape=true", "operator.extraEnv[0].value=10"),
)
VALUE_SETS = (DEFAULT, NAMESPACED, GPU, EVERYTHING)


class HelmError(RuntimeError):
    pass


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([tool("helm"), *args], capture_output=True, text=True, timeout=120, check=False)
    if check and result.returncode != 0:
        raise HelmError(f"helm {' '.join(args)} failed:\n{result.stderr}")
    return result


def template_args(values: ValueSet, *, chart: Path = CHART, kube_version: str | None = None) -> list[str]:
    args = ["template", RELEASE, str(chart), "--namespace", NAMESPACE, *values.helm_args()]
    if kube_version:
        args += ["--kube-version", kube_version]
    return args


@functools.cache
def render(values: ValueSet, kube_version: str | None = None) -> tuple[dict[str, Any], ...]:
    """The objects ``helm template`` prints for ``values`` (without the CRD in crds/)."""
    out = helm(*template_args(values, kube_version=kube_version)).stdout
    return tuple(doc for doc in yaml.safe_load_all(out) if doc)


def find(objects: tuple[dict[str, Any], ...], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]


def only(objects: tuple[dict[str, Any], ...], kind: str) -> dict[str, Any]:
    found = find(objects, kind)
    assert len(found) == 1, f"expected one {kind}, found {[o['metadata']['name'] for o in found]}"
    return found[0]


def operator_container(objects: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    (container,) = only(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    return container


def operator_env(objects: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    """The operator container's env: plain values as strings, downward-API entries as their source."""
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in operator_container(objects)["env"]}


def default_pod_settings(objects: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    return json.loads(operator_env(objects)["RLKUBE_DEFAULT_POD_SETTINGS"])


def kubernetes_problems(document: dict[str, Any], version: str) -> str | None:
    """None when ``document`` is valid for Kubernetes ``version`` (strict: unknown fields refused)."""
    try:
        kubernetes_validate.validate(document, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        path = ".".join(str(p) for p in exc.path)
        return f"{document['kind']}/{document['metadata'].get('name')} @ {version}: {path}: {exc.message}"
    return None


def has_schema(document: dict[str, Any], version: str) -> bool:
    try:
        kubernetes_validate.validate(document, version, strict=True)
    except kubernetes_validate.SchemaNotFoundError:
        return False
    except kubernetes_validate.ValidationError:
        return True
    return True
