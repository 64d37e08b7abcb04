"""Every manifest rlkube ships is accepted by a real kube-apiserver, as a user applies it.

kubectl's default (strict) validation, so an unknown or misspelt field fails too: the CRD from
crds/ and the chart's copy of it, the chart rendered with each of its value sets, and every
example RLJob.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml
from rlkube_devcluster.controlplane.build import kubernetes_version

from tests.delivery.chart import CHART, VALUE_SETS, ValueSet, helm
from tests.kubernetes.conftest import Kube
from tests.operator.harness import ROOT, kubectl

if TYPE_CHECKING:
    from rlkube_devcluster.controlplane.cluster import ControlPlane

EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
#: The Prometheus Operator's kinds: a bare cluster does not serve them (the chart renders them
#: only when metrics.serviceMonitor.enabled is set, for clusters that run it).
NOT_SERVED_GROUPS = ("monitoring.coreos.com/",)


def test_the_api_server_is_the_pinned_kubernetes_release(control_plane: ControlPlane) -> None:
    version = json.loads(kubectl(control_plane.kubeconfig, "version", "-o", "json").stdout)
    assert version["serverVersion"]["gitVersion"] == kubernetes_version()


def test_the_crd_applies_and_is_established(control_plane: ControlPlane, rljob_crd: None) -> None:
    crd = json.loads(kubectl(control_plane.kubeconfig, "get", "crd", "rljobs.rlkube.io", "-o", "json").stdout)
    established = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert established["Established"] == "True"
    assert established["NamesAccepted"] == "True"


def test_the_charts_copy_of_the_crd_is_accepted(control_plane: ControlPlane, rljob_crd: None) -> None:
    copy = CHART / "crds" / "rljob.yaml"
    result = kubectl(control_plane.kubeconfig, "apply", "--dry-run=server", "-f", str(copy), check=False)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("values", VALUE_SETS, ids=[v.name for v in VALUE_SETS])
def test_the_chart_rendered_with_each_value_set_applies(
    control_plane: ControlPlane, rljob_crd: None, values: ValueSet
) -> None:
    namespace = f"chart-{values.name}"
    rendered = helm(
        "template", f"rlkube-{values.name}", str(CHART), "--namespace", namespace, *values.helm_args()
    ).stdout
    objects = [o for o in yaml.safe_load_all(rendered) if o]
    served = [o for o in objects if not o["apiVersion"].startswith(NOT_SERVED_GROUPS)]
    assert served
    namespaces = {namespace} | {o["metadata"]["namespace"] for o in served if "namespace" in o["metadata"]}
    for name in sorted(namespaces):
        kubectl(control_plane.kubeconfig, "create", "namespace", name, check=False)
    # Each object says its namespace (the chart sets it); the cluster-scoped ones have none.
    result = kubectl(
        control_plane.kubeconfig, "apply", "-f", "-", input=yaml.safe_dump_all(served), check=False
    )
    assert result.returncode == 0, result.stderr
    for obj in served:
        meta = obj["metadata"]
        where = ["-n", meta["namespace"]] if "namespace" in meta else []
        got = kubectl(control_plane.kubeconfig, "get", *where, obj["kind"], meta["name"], check=False)
        assert got.returncode == 0, (obj["kind"], meta["name"], got.stderr)


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_every_example_rljob_applies(rljob_crd: None, kube: Kube, example: Path) -> None:
    result = kube("apply", "-f", str(example), check=False)
    assert result.returncode == 0, result.stderr
    for document in yaml.safe_load_all(example.read_text()):
        if document:
            assert kube.get(document["kind"], document["metadata"]["name"]) is not None


def test_what_the_operator_renders_for_an_example_applies_and_keeps_every_field(
    rljob_crd: None, kube: Kube
) -> None:
    rendered = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlkube.cli",
            "render",
            str(ROOT / "examples" / "rljob.yaml"),
            "--set",
            f"metadata.namespace={kube.namespace}",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    objects = [o for o in yaml.safe_load_all(rendered) if o]
    assert {o["kind"] for o in objects} >= {"StatefulSet", "Service", "ConfigMap"}
    result = kube.apply(rendered)
    assert result.returncode == 0, result.stderr
    for obj in objects:
        stored = kube.get(obj["kind"].lower(), obj["metadata"]["name"])
        assert stored is not None, obj["kind"]
        for section in ("spec", "data"):
            if section in obj:
                assert contains(stored[section], obj[section]), (obj["kind"], section)


def contains(stored: Any, rendered: Any) -> bool:
    """Whether every field of ``rendered`` is in ``stored`` with the same value (defaults may be added)."""
    if isinstance(rendered, dict):
        return isinstance(stored, dict) and all(
            key in stored and contains(stored[key], value) for key, value in rendered.items()
        )
    if isinstance(rendered, list):
        return (
            isinstance(stored, list)
            and len(stored) == len(rendered)
            and all(contains(s, r) for s, r in zip(stored, rendered, strict=True))
        )
    return bool(stored == rendered)
