"""What a person watching ``rlkube run`` sees: a live bar (rich) or plain lines, one observer each.

I/O: writes to the terminal. Both show epoch/max, env steps, steps/s, the mean return of the last
20 training episodes and the weight version; :class:`PlainProgress` (``--no-progress``, or output
that is not a terminal) prints at most one line per ``interval`` seconds, plus the last epoch.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.text import Text

from rlkube.engine.report import EpochRecord, RunStart, RunSummary


def describe(record: EpochRecord) -> str:
    ret = "-" if record.recent_return is None else f"{record.recent_return:.1f}"
    text = (
        f"env steps {record.env_steps:,} | {record.steps_per_second:,.0f} steps/s | "
        f"return(20) {ret} | weights v{record.weight_version}"
    )
    if record.eval_return is not None:
        text += f" | eval {record.eval_return:.1f}"
    return text


class LiveProgress:
    """A rich progress bar with the run's figures on the line below, redrawn in place."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self._bar = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("epochs"),
            TimeElapsedColumn(),
            console=console,
        )
        self._info = Text("collecting the first epoch...")
        self._live = Live(Group(self._bar, self._info), console=console, refresh_per_second=4)
        self._task: TaskID | None = None

    def on_start(self, start: RunStart) -> None:
        self._task = self._bar.add_task(start.job, total=start.max_epochs, completed=start.start_epoch)
        self._live.start()

    def on_epoch(self, record: EpochRecord) -> None:
        if self._task is not None:
            self._bar.update(self._task, completed=record.epoch)
        self._info.plain = describe(record)

    def on_finish(self, summary: RunSummary) -> None:
        self._live.stop()


class PlainProgress:
    """One line per epoch (at most one per ``interval`` seconds)."""

    def __init__(self, stream: TextIO | None = None, *, interval: float = 2.0) -> None:
        self.stream = stream or sys.stdout
        self.interval = interval
        self._last = float("-inf")

    def on_start(self, start: RunStart) -> None:
        where = f" (resuming after epoch {start.start_epoch})" if start.start_epoch else ""
        print(f"{start.job}: training for {start.max_epochs} epochs{where}", file=self.stream, flush=True)

    def on_epoch(self, record: EpochRecord) -> None:
        now = time.monotonic()
        if now - self._last >= self.interval or record.epoch >= record.max_epochs:
            self._last = now
            print(
                f"epoch {record.epoch}/{record.max_epochs} | {describe(record)}", file=self.stream, flush=True
            )

    def on_finish(self, summary: RunSummary) -> None:
        pass
