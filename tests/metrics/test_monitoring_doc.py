"""docs/operations.md's Monitoring table lists exactly the series the pods export."""

from __future__ import annotations

import re
from pathlib import Path

from rlkube.metrics import series

DOC = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()


def test_the_monitoring_table_lists_every_series_with_its_type_and_exporter() -> None:
    section = DOC.split("## Monitoring", 1)[1]
    rows = re.findall(r"^\| `(rlkube_[a-z_]+)` \| (\w+) \| ([\w ]+) \|", section, flags=re.M)
    documented = {name: (kind, who) for name, kind, who in rows}
    exported = {}
    for who, registry in (("rank 0", series.RANK_ZERO), ("train", series.TRAIN), ("eval", series.EVAL)):
        for family in registry.collect():
            name = family.name + ("_total" if family.type == "counter" else "")
            exported[name] = (family.type, who)
    assert documented == exported
