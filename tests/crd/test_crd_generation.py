"""The CRD is generated from spec.py, is structural, and its CEL rules agree with the Python checks.

The rules are judged by the real kube-apiserver (``kubectl apply --dry-run=server``): it fills in
the schema's defaults, then runs the CEL rules, as it does for every RLJob a user applies.
"""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml
from rlkube.spec import CROSS_FIELD_RULES, TrainSpec, parse_job
from rlkube_operator.crd import build_crd

from tests.conftest import MINIMAL_JOB
from tests.operator.harness import kubectl

if TYPE_CHECKING:
    from rlkube_devcluster.controlplane.cluster import ControlPlane

ROOT = Path(__file__).resolve().parents[2]


def spec_schema() -> dict[str, Any]:
    return build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def walk(node: Any, path: str = ""):
    if isinstance(node, dict):
        yield path, node
        for key, value in node.items():
            yield from walk(value, f"{path}/{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from walk(value, f"{path}[{index}]")


def test_committed_crd_and_reference_match_what_generate_writes() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "generate.py"), "--check"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


def test_committed_crd_is_the_built_crd() -> None:
    assert yaml.safe_load((ROOT / "crds" / "rljob.yaml").read_text()) == build_crd()


def test_schema_has_no_refs_titles_nulls_or_closed_objects() -> None:
    for path, node in walk(spec_schema()):
        assert "$ref" not in node, path
        assert "$defs" not in node, path
        assert "nullable" not in node, path
        assert node.get("type") != "null", path
        assert node.get("additionalProperties") is not False, path
        if "properties" in node:
            assert "title" not in node["properties"] or isinstance(node["properties"]["title"], dict), path


def test_every_schema_node_has_a_type_except_int_or_string() -> None:
    root = spec_schema()
    for path, node in walk(root):
        is_schema = path == "" or path.endswith(("items", "additionalProperties")) or "/properties/" in path
        if not is_schema or path.rsplit("/", 1)[-1] == "properties" or path.endswith("/required"):
            continue
        if path.split("/")[-2:-1] == ["properties"]:
            if node.get("x-kubernetes-int-or-string"):
                assert node["anyOf"] == [{"type": "integer"}, {"type": "string"}], path
            else:
                assert "type" in node, path


def test_anyof_is_used_only_for_int_or_string_quantities() -> None:
    for path, node in walk(spec_schema()):
        if "anyOf" in node:
            assert node.get("x-kubernetes-int-or-string") is True, path


def test_free_form_sections_preserve_unknown_fields() -> None:
    spec = spec_schema()["properties"]["spec"]["properties"]
    for section in ("modelCfg", "optimCfg", "algoCfg"):
        assert spec["policy"]["properties"][section]["x-kubernetes-preserve-unknown-fields"] is True
    assert spec["env"]["properties"]["kwargs"]["x-kubernetes-preserve-unknown-fields"] is True
    assert spec["trainer"]["properties"]["affinity"]["x-kubernetes-preserve-unknown-fields"] is True


def test_enums_minimums_and_defaults_come_from_spec_py() -> None:
    spec = spec_schema()["properties"]["spec"]
    assert spec["properties"]["engine"]["enum"] == ["sync", "async", "eval", "rsl"]
    assert spec["properties"]["train"]["properties"]["maxEpochs"] == {
        "default": 100,
        "description": "Epochs to train; one epoch publishes one weight version.",
        "minimum": 1,
        "type": "integer",
    }
    assert spec["properties"]["log"]["properties"]["intervalSeconds"]["exclusiveMinimum"] is True
    assert spec["properties"]["train"]["default"] == TrainSpec().model_dump(
        by_alias=True, exclude_none=True, mode="json"
    )
    assert spec["required"] == ["env"]


def test_an_omitted_section_defaults_to_the_object_its_own_defaults_make() -> None:
    # The API server checks a default against the schema and the CEL rules without filling in the
    # defaults nested in it: `default: {}` for scheduling failed `self.gang != 'kueue'` there.
    def walk(node: dict[str, Any], path: str) -> None:
        properties = node.get("properties", {})
        if node.get("type") == "object" and isinstance(node.get("default"), dict) and properties:
            nested = {name: sub["default"] for name, sub in properties.items() if "default" in sub}
            assert node["default"] == nested, path
        for name, sub in properties.items():
            walk(sub, f"{path}.{name}")

    spec = spec_schema()["properties"]["spec"]
    walk(spec, "spec")
    assert spec["properties"]["scheduling"]["default"] == {
        "gang": "none",
        "kueueIntegration": "StatefulSet",
        "disruptionBudget": True,
    }


def test_scale_subresource_points_at_eval_replicas() -> None:
    version = build_crd()["spec"]["versions"][0]
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.evaluator.replicas",
        "statusReplicasPath": ".status.eval.replicas",
        "labelSelectorPath": ".status.eval.selector",
    }
    assert version["subresources"]["status"] == {}


def test_printer_columns_and_names() -> None:
    crd = build_crd()
    columns = [c["name"] for c in crd["spec"]["versions"][0]["additionalPrinterColumns"]]
    assert columns == ["Phase", "Train", "Eval", "Epoch", "Published", "Loaded", "Return", "Age"]
    assert crd["spec"]["names"]["shortNames"] == ["rlj"]
    assert "rlkube" in crd["spec"]["names"]["categories"]


def test_status_schema_describes_every_printer_column() -> None:
    root = spec_schema()
    for column in build_crd()["spec"]["versions"][0]["additionalPrinterColumns"]:
        if column["jsonPath"].startswith(".metadata."):
            continue
        node = root
        for part in column["jsonPath"].strip(".").split("."):
            node = node["properties"][part]
        assert node["type"] in ("string", "integer", "number"), column


def server_refusals(control_plane: ControlPlane, document: dict[str, Any]) -> str:
    """What the API server says when ``document`` is applied (a dry run): "" when it is admitted."""
    result = kubectl(
        control_plane.kubeconfig,
        "apply",
        "--dry-run=server",
        "-n",
        "default",
        "-f",
        "-",
        input=yaml.safe_dump(document),
        check=False,
    )
    return "" if result.returncode == 0 else result.stderr


def cel_holds(rule: Any, refusals: str) -> bool:
    """Whether the server's answer does not name ``rule`` (its message in the CRD names its field)."""
    return f"{rule.path}: {rule.message}" not in refusals


SAMPLES = [
    {},
    {"train": {"batchSize": 64, "stepsPerEpoch": 32}},
    {"train": {"batchSize": 32, "stepsPerEpoch": 32}},
    {"trainer": {"backend": "nccl"}},
    {"trainer": {"backend": "nccl", "resources": {"limits": {"nvidia.com/gpu": 2}}}},
    {"trainer": {"backend": "gloo"}},
    {"engine": "eval"},
    {"engine": "eval", "checkpoint": {"path": "/ckpt/x.pt"}},
    {"trainer": {"env": [{"name": "RANK", "value": "3"}]}},
    {"trainer": {"env": [{"name": "MY_FLAG", "value": "3"}]}},
    {"evaluator": {"env": [{"name": "PET_NNODES", "value": "3"}]}},
    {"evaluator": {"env": [{"name": "RLKUBE_X", "value": "3"}, {"name": "OK", "value": "1"}]}},
]


@pytest.mark.parametrize("extra", SAMPLES, ids=[str(s)[:50] for s in SAMPLES])
def test_cel_rules_agree_with_the_python_checks(
    control_plane: ControlPlane, rljob_crd: None, extra: dict[str, Any]
) -> None:
    document = copy.deepcopy(MINIMAL_JOB)
    document["spec"].update(extra)
    refusals = server_refusals(control_plane, document)
    for rule in CROSS_FIELD_RULES:
        assert cel_holds(rule, refusals) == _python_rule_holds(rule, document["spec"]), (rule.path, refusals)


@pytest.mark.parametrize("extra", [{"train": {"batchSize": 4096}}, {"train": {"stepsPerEpoch": 8}}])
def test_cel_rules_see_defaults_as_the_api_server_does(
    control_plane: ControlPlane, rljob_crd: None, extra: dict[str, Any]
) -> None:
    # One of the two fields is left out: the rule compares the given one with the other's default.
    rule = CROSS_FIELD_RULES[0]
    document = copy.deepcopy(MINIMAL_JOB)
    document["spec"].update(extra)
    refusals = server_refusals(control_plane, document)
    assert f"{rule.path}: Invalid value" in refusals, refusals
    assert cel_holds(rule, refusals) is False
    assert _python_rule_holds(rule, document["spec"]) is False


def _python_rule_holds(rule, spec: dict[str, Any]) -> bool:
    from rlkube.spec import SpecError

    document = copy.deepcopy(MINIMAL_JOB)
    document["spec"] = copy.deepcopy(spec)
    try:
        parse_job(document)
    except SpecError as exc:
        return not any(problem.startswith(rule.path + ":") for problem in exc.problems)
    return True


def test_every_cel_rule_names_its_field() -> None:
    # The API server compiles each rule when the CRD is applied (tests/kubernetes/test_shipped_manifests.py).
    rules = spec_schema()["properties"]["spec"]["x-kubernetes-validations"]
    assert len(rules) == len(CROSS_FIELD_RULES)
    for rule in rules:
        assert rule["message"].startswith("spec.")
        assert rule["fieldPath"].startswith(".")
