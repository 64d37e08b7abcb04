"""``rlkube journal RUN_DIR``: what a run's acknowledgement journal holds, read without changing it.

The journal's segments are not one file per fragment, so ``ls`` no longer tells an operator what a
restarted rank 0 would take back; this does: entries by step, the checkpoint's step, what each
incarnation acknowledged, quarantined fragments, and the files.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rlkube.coordinator.journal import JOURNAL_DIR, AckJournal
from rlkube.engine.run_paths import RunPaths


def describe(journal: AckJournal) -> list[str]:
    """The report's lines. Reads only."""
    segments = journal.segment_files()
    size = sum(path.stat().st_size for path in segments)
    held = journal.held()
    by_step = ", ".join(
        f"{'no step yet' if step is None else f'step {step}'}: {count}"
        for step, count in sorted(held.items(), key=lambda item: (item[0] is None, item[0] or 0))
    )
    acknowledged = journal.acknowledged_by_incarnation()
    acknowledged.pop(journal.incarnation, None)
    lines = [
        f"journal {journal.directory}: {len(segments)} segments, {size / 1e6:.1f} MB",
        f"taken back by a restart: {sum(held.values())} fragments" + (f" ({by_step})" if by_step else ""),
        f"a checkpoint holds the steps below {journal.checkpoint}",
        "acknowledged, by incarnation: "
        + (", ".join(f"{name}: {count}" for name, count in sorted(acknowledged.items())) or "none"),
        f"quarantined: {journal.quarantined()} ({journal.quarantine_dir})",
    ]
    older = journal.entry_files()
    if older:
        lines.append(
            f"{len(older)} entries of an older rlkube (a file each): moved into segments when rank 0 starts"
        )
    return lines


def journal_command(args: argparse.Namespace) -> int:
    paths = RunPaths(Path(args.run_dir))
    directory = paths.checkpoints / JOURNAL_DIR
    if not directory.is_dir():
        print(
            f"rlkube: no journal at {directory} (is {args.run_dir} a run directory? "
            "a run writes it once it acknowledges its first fragment)",
            file=sys.stderr,
        )
        return 1
    journal = AckJournal(directory, incarnation="inspect", quarantine=paths.quarantine).open(read_only=True)
    print("\n".join(describe(journal)))
    return 0
