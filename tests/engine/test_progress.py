"""Progress shows epoch/max, env steps, steps/s, the 20-episode mean return and the weight version."""

from __future__ import annotations

import io

from rich.console import Console
from rlkube.engine.report import EpochRecord, RunStart, RunSummary
from rlkube.launch.progress import LiveProgress, PlainProgress

START = RunStart(job="cartpole", max_epochs=10, start_epoch=0, env_steps=0, weight_version=0)
SUMMARY = RunSummary(
    job="cartpole",
    final_return=480.0,
    env_steps=2048,
    epochs=2,
    wall_seconds=1.0,
    weight_version=2,
    stop_reason="max_epochs",
    fingerprints_consistent=True,
)


def record(epoch: int, *, recent: float | None = 123.45) -> EpochRecord:
    return EpochRecord(
        epoch=epoch,
        max_epochs=10,
        env_steps=1024 * epoch,
        weight_version=epoch,
        steps_per_second=4321.0,
        recent_return=recent,
        episodes_total=3,
        new_episodes=(),
    )


def test_plain_lines_carry_every_figure() -> None:
    out = io.StringIO()
    progress = PlainProgress(out, interval=0.0)
    progress.on_start(START)
    progress.on_epoch(record(1, recent=None))
    progress.on_epoch(record(2))
    progress.on_finish(SUMMARY)
    lines = out.getvalue().splitlines()
    assert lines[0] == "cartpole: training for 10 epochs"
    assert lines[1] == "epoch 1/10 | env steps 1,024 | 4,321 steps/s | return(20) - | weights v1"
    assert lines[2] == "epoch 2/10 | env steps 2,048 | 4,321 steps/s | return(20) 123.5 | weights v2"


def test_plain_lines_are_throttled_but_the_last_epoch_is_shown() -> None:
    out = io.StringIO()
    progress = PlainProgress(out, interval=3600.0)
    for epoch in range(1, 11):
        progress.on_epoch(record(epoch))
    shown = [line.split(" |")[0] for line in out.getvalue().splitlines()]
    assert shown == ["epoch 1/10", "epoch 10/10"]


def test_the_live_bar_draws_the_bar_and_the_figures() -> None:
    buffer = io.StringIO()
    progress = LiveProgress(Console(file=buffer, force_terminal=True, width=100))
    progress.on_start(START)
    progress.on_epoch(record(3))
    progress.on_finish(SUMMARY)
    text = buffer.getvalue()
    assert "3/10" in text
    assert "env steps 3,072 | 4,321 steps/s | return(20) 123.5 | weights v3" in text
