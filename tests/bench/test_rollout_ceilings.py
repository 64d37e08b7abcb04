"""``rlkube bench rollout`` puts beside every row the ceiling that applies and the share achieved."""

from __future__ import annotations

import pytest

from benchmarks.rollout.run import add_ceilings, learner_ceiling


def row(method: str, workers: int, steps_per_second: float) -> dict[str, object]:
    return {"method": method, "requests": "batched", "workers": workers, "steps_per_second": steps_per_second}


def test_the_learner_ceiling_is_what_the_in_process_row_spends_beyond_its_rollouts() -> None:
    # 100 us per env step rolling out, 125 us in process: the learner takes 25 us per step.
    assert learner_ceiling(10_000.0, 8_000.0) == pytest.approx(40_000.0)
    assert learner_ceiling(10_000.0, 12_000.0) is None  # noise: no learner cost to see


def test_each_cluster_row_is_held_to_the_lowest_of_learner_envs_and_intake() -> None:
    rows = [row("bound", 1, 10_000.0), row("in-process", 1, 8_000.0)]
    rows += [row("cluster", 1, 9_000.0), row("cluster", 8, 30_000.0), row("cluster", 4, 20_000.0)]
    intake = {
        1: {"fragments_per_second": 400.0, "env_steps_per_second": 102_400.0},
        4: {"fragments_per_second": 60.0, "env_steps_per_second": 15_360.0},
        8: {"fragments_per_second": 400.0, "env_steps_per_second": 102_400.0},
    }
    add_ceilings(rows, intake)
    one, eight, four = rows[2:]
    assert (one["ceiling_is"], one["ceiling"], one["of_ceiling"]) == ("envs", 10_000.0, 0.9)
    assert eight["ceiling_is"] == "learner"
    assert eight["of_ceiling"] == pytest.approx(0.75)
    assert four["ceiling_is"] == "intake"  # the plumbing, when it is the lowest, is named
    assert four["intake_fragments_per_second"] == 60.0
