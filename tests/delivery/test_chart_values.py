"""values.schema.json refuses bad values with the key named; values.yaml is fully commented."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import yaml

from tests.delivery.chart import CHART, DEFAULT, ValueSet, helm, template_args

SCHEMA = json.loads((CHART / "values.schema.json").read_text())

BAD_VALUES = [
    # (--set, text helm's error must contain)
    ("operator.logLevel=loud", "operator.logLevel"),
    ("operator.metricsPort=0", "operator.metricsPort"),
    ("operator.metricsPort=http", "operator.metricsPort"),
    ("operator.typo=1", "typo"),
    ("image.pullPolicy=Sometimes", "image.pullPolicy"),
    ("image.digest=latest", "image.digest"),
    ("image.repository=", "image.repository"),
    ("watchNamespaces={Team_A}", "watchNamespaces.0"),
    ("watchNamespaces={a,a}", "watchNamespaces"),
    ("watchNamespaces=team-a", "watchNamespaces"),
    ("metrics.service.port=70000", "metrics.service.port"),
    ("metrics.serviceMonitor.interval=often", "metrics.serviceMonitor.interval"),
    ("networkPolicy.enabled=maybe", "networkPolicy.enabled"),
    ("rbac.create=yes", "rbac.create"),
    ("jobDefaults.trainer.replicas=4", "replicas"),
    ("jobDefaults.trainer.imagePullPolicy=Sometimes", "jobDefaults.trainer.imagePullPolicy"),
    ("jobDefaults.evaluator.resources.limits.cpu=lots", "jobDefaults.evaluator.resources.limits.cpu"),
    ("jobDefaults.trainer.tolerations[0].operator=Maybe", "jobDefaults.trainer.tolerations.0.operator"),
    ("jobDefaults.trainer.nodeSelector.gpu=true", "jobDefaults.trainer.nodeSelector.gpu"),
    ("nameOverride=Not_A_Name", "nameOverride"),
    # The operator would refuse these at start (RLKUBE_DEFAULT_POD_SETTINGS); helm refuses them first.
    ("jobDefaults.trainer.env[0].name=RLKUBE_ROLE", "jobDefaults.trainer.env.0.name"),
    ("jobDefaults.evaluator.env[0].name=MASTER_ADDR", "jobDefaults.evaluator.env.0.name"),
    ("jobDefaults.trainer.backend=nccl", "backend"),
]


@pytest.mark.parametrize(("assignment", "named"), BAD_VALUES, ids=[a for a, _ in BAD_VALUES])
def test_helm_refuses_bad_values_naming_the_key(assignment: str, named: str) -> None:
    result = helm(*template_args(ValueSet("bad", sets=(assignment,))), check=False)
    assert result.returncode != 0, f"--set {assignment} was accepted"
    assert "schema" in result.stderr, result.stderr
    assert named in result.stderr, result.stderr


def test_values_files_satisfy_the_schema() -> None:
    for name in ("values.yaml", "values-gpu.yaml"):
        jsonschema.validate(yaml.safe_load((CHART / name).read_text()), SCHEMA)


def test_schema_describes_every_key_of_values_yaml_and_nothing_else() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def keys(node: object, schema: dict, path: str) -> None:
        if "$ref" in schema:
            schema = SCHEMA["definitions"][schema["$ref"].rsplit("/", 1)[1]]
        if not isinstance(node, dict) or "properties" not in schema:
            return
        for key, child in node.items():
            assert key in schema["properties"], f"{path}{key} is in values.yaml but not in the schema"
            keys(child, schema["properties"][key], f"{path}{key}.")

    keys(values, SCHEMA, "")
    documented = set(SCHEMA["properties"]) - {"global"}
    assert documented == set(values), "the schema and values.yaml have different top-level keys"


def test_every_top_and_second_level_key_in_values_yaml_has_a_comment() -> None:
    """A key is commented when a comment line sits above it or above the run of sibling keys it ends."""
    lines = (CHART / "values.yaml").read_text().splitlines()
    key_line = re.compile(r"^(?P<indent> *)(?P<key>[\w.-]+):")
    uncommented = []
    for index, line in enumerate(lines):
        match = key_line.match(line)
        if not match or len(match["indent"]) > 2:
            continue
        above = index - 1
        # Walk up over sibling keys (same indent) and their nested lines, stopping at a blank line.
        while above >= 0 and lines[above].strip() and not lines[above].lstrip().startswith("#"):
            sibling = key_line.match(lines[above])
            if sibling and len(sibling["indent"]) < len(match["indent"]):
                break
            above -= 1
        if above < 0 or not lines[above].lstrip().startswith("#"):
            uncommented.append(match["key"])
    assert not uncommented, f"values.yaml keys without a comment: {uncommented}"


def test_default_values_render() -> None:
    assert helm(*template_args(DEFAULT)).stdout


def test_job_env_names_the_schema_refuses_are_the_env_contracts() -> None:
    from rlkube import contract
    from rlkube.spec import RESERVED_ENV_NAMES, RESERVED_ENV_PREFIXES

    refused = re.compile(SCHEMA["definitions"]["jobEnvList"]["items"]["properties"]["name"]["not"]["pattern"])
    for name in (*RESERVED_ENV_NAMES, *(p + "X" for p in RESERVED_ENV_PREFIXES)):
        assert refused.search(name), name
    for var in contract.ENV_CONTRACT:
        assert refused.search(var.name), var.name
    for name in ("NCCL_DEBUG", "OMP_NUM_THREADS", "MY_RANK", "RANKS"):
        assert not refused.search(name), name
