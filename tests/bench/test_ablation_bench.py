"""``rlkube bench ablation``: every arm is a valid job, and the table's interval maths."""

from __future__ import annotations

from pathlib import Path

import pytest
from rlkube.jobfile import load_job
from rlkube.policy.builtin.ppo_config import PPOAlgoConfig, PPOModelConfig, parse_section

from benchmarks.learn.ablation import ARMS, PEER, interval, table

ROOT = Path(__file__).resolve().parents[2]


def test_every_arm_is_a_valid_halfcheetah_job_that_sets_what_its_name_says() -> None:
    for arm, overrides in ARMS.items():
        job = load_job(ROOT / "examples" / "halfcheetah.yaml", list(overrides))
        algo = parse_section(PPOAlgoConfig, job.spec.policy.algo_cfg, path="algoCfg")
        model = parse_section(PPOModelConfig, job.spec.policy.model_cfg, path="modelCfg")
        assert (algo.clip_vloss_form == "clipped") == (arm in ("vclip-clipped", "both")), arm
        assert (model.observation_stats == "perStep") == (arm in ("stats-per-step", "both")), arm
        assert algo.clip_vloss == (arm != "no-vclip"), arm
    assert ARMS[PEER] == ()


def test_the_interval_is_a_95_percent_t_interval_over_seeds() -> None:
    assert interval([5.0]) == (5.0, 0.0)
    mean, half = interval([1.0, 3.0])  # stdev sqrt 2, t(1) 12.706, / sqrt 2
    assert mean == 2.0
    assert half == pytest.approx(12.706)


def test_the_table_shows_each_arms_seeds_and_curve() -> None:
    runs = [
        {
            "arm": arm,
            "seed": seed,
            "final_return": ret,
            "env_steps": 1000,
            "wall_seconds": 10.0,
            "load_average": [1.0, 2.0],
            "episodes": [[500, ret / 2], [1000, ret]],
        }
        for arm, seed, ret in (("rlkube", 2, 100.0), ("rlkube", 3, 300.0), ("sb3", 2, 50.0))
    ]
    text = table(runs, 1000, ["rlkube", "sb3"])
    assert "s2:100 s3:300" in text
    assert "200.0 ±" in text
    assert "s2:50" in text
