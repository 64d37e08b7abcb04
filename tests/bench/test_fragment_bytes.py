"""``rlkube bench fragment-bytes``: a pixel job's fragment travels as uint8, about 4x lighter than float32."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.rollout.fragment_bytes import measure, report

pytest.importorskip("ale_py")
pytestmark = pytest.mark.slow  # a real Breakout rollout with NatureCNN: ~10 s quiet, minutes under load

BREAKOUT = Path(__file__).parents[2] / "examples" / "breakout.yaml"


def test_a_breakout_fragment_keeps_its_frames_uint8_on_the_wire() -> None:
    row = measure(BREAKOUT)
    frames = {key: entry for key, entry in row["leaves"].items() if entry[0] == "uint8"}
    assert frames, f"no uint8 leaf in the fragment: {row['leaves']}"
    # 8 envs x 128 steps of 4 x 84 x 84 frames, for every uint8 leaf (observation, next observation).
    assert all(nbytes == 8 * 128 * 4 * 84 * 84 for _, nbytes in frames.values())
    payload = sum(nbytes for _, nbytes in row["leaves"].values())
    assert payload <= row["message_bytes"] < payload * 1.01  # the message is the leaves, little else
    # Frames dominate: as float32 the same fragment weighs between 3x and 4x as much.
    assert 3.0 < row["message_bytes_float32"] / row["message_bytes"] <= 4.0
    assert "ratio float32 / as sent" in report(row)
