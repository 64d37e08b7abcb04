"""The async engine drops stale fragments, or trains on all of them tagged for V-trace."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from rlkube.data.fragment import POLICY_LAG, Fragment
from rlkube.data.rollout_buffer import EpochBatch
from rlkube.engine.async_engine import split_by_staleness, tag_with_lags, used_share
from tensordict import TensorDict

from tests.engine.jobs import tiny_job
from tests.engine.test_in_process import run


def batch_of_versions(*versions: int) -> EpochBatch:
    fragments = tuple(
        Fragment(data=TensorDict({"reward": torch.zeros(2, 3)}, batch_size=[2, 3]), weight_version=v)
        for v in versions
    )
    return EpochBatch(epoch=0, task_ids=tuple(f"t{i}" for i in range(len(versions))), fragments=fragments)


def test_vtrace_mode_keeps_every_fragment_and_tags_each_step_with_its_lag() -> None:
    batch = batch_of_versions(5, 3, 6)
    tagged, lags = tag_with_lags(batch, version=5)
    assert lags == [0, 2, 0]  # a fragment from a later incarnation's version counts as fresh
    assert [f.data[POLICY_LAG].tolist() for f in tagged.fragments] == [
        [[0] * 3] * 2,
        [[2] * 3] * 2,
        [[0] * 3] * 2,
    ]
    assert POLICY_LAG not in batch.fragments[0].data  # the original fragments are untouched
    kept, _, dropped = split_by_staleness(batch, version=5, max_staleness=1)
    assert (len(kept.fragments), dropped) == (2, 1)


def test_the_share_of_fragments_used_counts_dropped_ones_against_it() -> None:
    assert used_share(3, 1) == 0.75
    assert used_share(0, 0) == 1.0


def test_async_with_vtrace_trains_on_every_fragment_in_process(tmp_path: Path) -> None:
    job = tiny_job(
        maxEpochs=4,
        maxStaleness=0,
        staleFragments="vtrace",
        spec={"engine": "async", "buffer": {"capacity": 8}},
    )
    _, summary = run(job, tmp_path)
    assert summary.epochs == 4
    data = json.loads((tmp_path / "summary.json").read_text())
    assert data["stale_fragments"] == "vtrace"
    assert data["dropped_stale"] == 0
    assert data["fragments_used_share"] == 1.0
    lags = {int(lag): count for lag, count in data["lag_distribution"].items()}
    assert data["fragments_trained"] == sum(lags.values())
    assert data["corrected_stale"] == sum(count for lag, count in lags.items() if lag > 0)
