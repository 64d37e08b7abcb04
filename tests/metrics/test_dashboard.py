"""The Grafana dashboard the chart ships asks only for series the code exports, and shows all of them."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rlkube.metrics import series
from rlkube_operator import metrics as operator_metrics

DASHBOARD = Path(__file__).resolve().parents[2] / "charts" / "rlkube" / "dashboards" / "rlkube.json"
IDENTIFIER = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
#: PromQL words that are not metric names (aggregation modifiers, operators).
KEYWORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "and",
    "or",
    "unless",
    "bool",
    "offset",
}


def expressions(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "expr" and isinstance(value, str):
                yield value
            else:
                yield from expressions(value)
    elif isinstance(node, list):
        for item in node:
            yield from expressions(item)


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (functions, label names, durations left out)."""
    text = re.sub(r'"[^"]*"', '""', expr)  # label values
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", " ", text)  # grouping labels
    text = re.sub(r"\[[^\]]*\]", " ", text)  # range durations
    names = set()
    for match in IDENTIFIER.finditer(text):
        word = match.group()
        following = text[match.end() :].lstrip()
        if word in KEYWORDS or following.startswith("("):  # a function call
            continue
        if re.fullmatch(r"[0-9.e]+", word):
            continue
        names.add(word)
    return names


def exported() -> set[str]:
    return series.series_names() | series.series_names(operator_metrics.REGISTRY)


def dashboard_names() -> set[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return {name for expr in expressions(dashboard["panels"]) for name in metric_names(expr)}


def test_the_expression_parser_finds_metric_names_and_nothing_else() -> None:
    expr = 'histogram_quantile(0.99, sum by (le, stage) (rate(a_seconds_bucket{ns="x", job=~"$j"}[5m]))) / b'
    assert metric_names(expr) == {"a_seconds_bucket", "b"}


def test_every_series_the_dashboard_asks_for_is_exported_by_a_pod_or_the_operator() -> None:
    asked = dashboard_names()
    assert asked, "no expressions found"
    assert not asked - exported(), (
        f"the dashboard asks for series nobody exports: {sorted(asked - exported())}"
    )


def test_the_dashboard_shows_every_series_the_pods_export() -> None:
    asked = dashboard_names()
    families = {
        family.name
        for registry in (series.RANK_ZERO, series.TRAIN, series.EVAL)
        for family in registry.collect()
    }
    unshown = {f for f in families if not any(a == f or a.startswith(f + "_") for a in asked)}
    assert not unshown, f"exported but on no panel: {sorted(unshown)}"


def test_the_dashboard_variables_select_by_the_labels_the_pod_monitor_adds() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"datasource", "namespace", "rljob"} <= variables
    pod_monitor = (DASHBOARD.parents[1] / "templates" / "podmonitor.yaml").read_text()
    assert "targetLabel: rljob" in pod_monitor
