"""``spec.env.wrappers``: every wrapper's settings are checked, each error names its list entry and field."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from rlkube.spec import WRAPPER_TYPES, SpecError, parse_job

from tests.conftest import MINIMAL_JOB


def job_with_wrappers(wrappers: list[Any]) -> dict[str, Any]:
    document = copy.deepcopy(MINIMAL_JOB)
    document["spec"].setdefault("env", {})["wrappers"] = wrappers
    return document


def problems(wrappers: list[Any]) -> list[str]:
    with pytest.raises(SpecError) as caught:
        parse_job(job_with_wrappers(wrappers))
    return caught.value.problems


BAD_SETTINGS = [
    # (one wrapper entry, text the error must contain)
    ({"type": "ClipAction", "low": -1}, "spec.env.wrappers[1].low: unknown field"),
    ({"type": "RescaleAction", "minAction": 1, "maxAction": -1}, "spec.env.wrappers[1]: got"),
    ({"type": "RescaleAction", "minAction": "low"}, "spec.env.wrappers[1].minAction: got 'low'"),
    ({"type": "NormalizeReward", "gamma": 1.5}, "spec.env.wrappers[1].gamma: got 1.5, expected less than"),
    (
        {"type": "NormalizeReward", "epsilon": 0},
        "spec.env.wrappers[1].epsilon: got 0, expected greater than 0",
    ),
    ({"type": "NormalizeReward", "clip": -1}, "spec.env.wrappers[1].clip: got -1"),
    ({"type": "ScaleReward"}, "spec.env.wrappers[1].scale: required field is missing"),
    ({"type": "ScaleReward", "scale": 0}, "spec.env.wrappers[1].scale: got 0, expected greater than 0"),
    ({"type": "ClipReward", "min": 2, "max": 1}, "min (2.0) must not exceed max (1.0)"),
    ({"type": "ClipReward", "sign": "maybe"}, "spec.env.wrappers[1].sign: got 'maybe'"),
    ({"type": "FrameStack", "stackSize": 0}, "spec.env.wrappers[1].stackSize: got 0"),
    (
        {"type": "FrameStack", "stack_size": 4},
        "spec.env.wrappers[1].stack_size: unknown field (did you mean 'stackSize'?)",
    ),
    ({"type": "AtariPreprocessing", "frameSkip": 0}, "spec.env.wrappers[1].frameSkip: got 0"),
    ({"type": "AtariPreprocessing", "screenSize": 4}, "spec.env.wrappers[1].screenSize: got 4"),
    ({"type": "AtariPreprocessing", "noopMax": -1}, "spec.env.wrappers[1].noopMax: got -1"),
    ({"type": "EpisodicLife", "lives": 3}, "spec.env.wrappers[1].lives: unknown field"),
    ({"type": "FireReset", "action": 1}, "spec.env.wrappers[1].action: unknown field"),
    ({"type": "TimeLimit"}, "spec.env.wrappers[1].maxEpisodeSteps: required field is missing"),
    ({"type": "TimeLimit", "maxEpisodeSteps": 0}, "spec.env.wrappers[1].maxEpisodeSteps: got 0"),
    ({"type": "Custom"}, "spec.env.wrappers[1].name: required field is missing"),
    ({"type": "Custom", "name": ""}, "spec.env.wrappers[1].name: got ''"),
    ({"type": "NormalizeObservation"}, "spec.policy.modelCfg.normalizeObservation"),
    ({"type": "Grayscale"}, "spec.env.wrappers[1]: got"),
    ({"stackSize": 4}, "spec.env.wrappers[1]"),
]


@pytest.mark.parametrize(("entry", "message"), BAD_SETTINGS, ids=[str(e[0]) for e in BAD_SETTINGS])
def test_a_bad_wrapper_setting_is_refused_naming_its_entry_and_field(
    entry: dict[str, Any], message: str
) -> None:
    found = problems([{"type": "ClipAction"}, entry])
    assert any(message in line for line in found), found


def test_every_wrapper_type_has_a_bad_settings_case() -> None:
    covered = {entry.get("type") for entry, _ in BAD_SETTINGS}
    assert set(WRAPPER_TYPES) <= covered


def test_wrappers_keep_their_order_and_typed_settings() -> None:
    wrappers = [
        {"type": "AtariPreprocessing", "noopMax": 30, "frameSkip": 4},
        {"type": "EpisodicLife"},
        {"type": "FireReset"},
        {"type": "ClipReward", "sign": True},
        {"type": "FrameStack", "stackSize": 4},
    ]
    env = parse_job(job_with_wrappers(wrappers)).spec.env
    assert [w.type for w in env.wrappers] == [
        "AtariPreprocessing",
        "EpisodicLife",
        "FireReset",
        "ClipReward",
        "FrameStack",
    ]
    assert env.wrappers[0].screen_size == 84  # type: ignore[union-attr]
    assert env.wrappers[4].stack_size == 4  # type: ignore[union-attr]


def test_the_crd_checks_the_wrapper_type_at_apply_time() -> None:
    from rlkube_operator.crd import build_crd

    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    item = schema["properties"]["spec"]["properties"]["env"]["properties"]["wrappers"]["items"]
    assert item["required"] == ["type"]
    assert item["properties"]["type"]["enum"] == list(WRAPPER_TYPES)
