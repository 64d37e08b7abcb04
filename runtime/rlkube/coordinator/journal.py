"""The acknowledgement journal: what a worker was told is accepted survives a crash of rank 0.

I/O (files next to the checkpoints). The coordinator writes every fragment it acknowledges in a
sync epoch to ``<checkpoints>/acknowledged/e<epoch>-<incarnation>-<n>.frag`` (the wire encoding
of :mod:`rlkube.coordinator.wire`: a manifest plus raw bytes, no pickle; written to a temporary
name, synced and renamed) *before* the worker hears "accepted". A checkpoint of epoch ``P``
(``P`` epochs trained) makes the fragments of epochs ``< P`` redundant: they are deleted then.

After a crash, rank 0 resumes from its newest checkpoint (epoch ``P``) and, as it opens each
epoch ``e >= P``, takes the journalled fragments of ``e`` back into the epoch's batch and queues
only the missing tasks. So every acknowledged fragment is trained on exactly once in the run's
surviving history — also one the dead incarnation had trained on after its last checkpoint,
since that training was lost with it. (Such a fragment was collected with weights the new
incarnation never had; PPO's clipped ratio, computed against the log-probabilities stored with
the fragment, treats it as mildly off-policy data.)

``acks-<incarnation>.json`` counts what each incarnation acknowledged, so the summary can add
up every incarnation of the run. Async engines do not journal (their buffer holds fragments of
many versions at once, and a restart re-opens the stream; their summary counts per incarnation).
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path

from rlkube._proto import policy_group_pb2 as pb
from rlkube.coordinator.wire import fragment_from_proto, fragment_to_proto
from rlkube.data.fragment import Fragment

logger = logging.getLogger(__name__)

JOURNAL_DIR = "acknowledged"
_FRAGMENT = re.compile(r"^e(\d{6,})-([0-9a-zA-Z]+)-(\d{6,})\.frag$")
_COUNTS = re.compile(r"^acks-([0-9a-zA-Z]+)\.json$")


def _write_synced(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


class AckJournal:
    """The acknowledged, not yet checkpointed fragments of one job (see the module docstring)."""

    def __init__(self, directory: str | os.PathLike[str], *, incarnation: str) -> None:
        self.directory = Path(directory)
        self.incarnation = incarnation
        self.acknowledged = 0  # by this incarnation
        self._written = 0

    def open(self) -> AckJournal:
        self.directory.mkdir(parents=True, exist_ok=True)
        return self

    def record(self, *, epoch: int, fragment: Fragment) -> None:
        """Make ``fragment`` (acknowledged in ``epoch``) durable; call before acknowledging it."""
        self._written += 1
        message = fragment_to_proto(fragment, task_id=f"journal-{self._written}", worker_id="", epoch=epoch)
        name = f"e{epoch:06d}-{self.incarnation}-{self._written:06d}.frag"
        _write_synced(self.directory / name, message.SerializeToString())
        self.acknowledged += 1
        _write_synced(
            self.directory / f"acks-{self.incarnation}.json",
            json.dumps({"acknowledged": self.acknowledged}).encode(),
        )

    def pending(self, epoch: int) -> list[Fragment]:
        """The journalled fragments of ``epoch`` (any incarnation), in the order they were written."""
        found = []
        for path in self.directory.iterdir() if self.directory.is_dir() else ():
            match = _FRAGMENT.match(path.name)
            if match and int(match.group(1)) == epoch:
                found.append((path.name, path))
        fragments = []
        for _, path in sorted(found):
            try:
                fragments.append(fragment_from_proto(pb.Fragment.FromString(path.read_bytes())))
            except (OSError, ValueError) as exc:  # a torn file cannot have been acknowledged
                logger.warning("skipping unreadable journal entry %s: %s", path, exc)
        return fragments

    def checkpointed(self, epoch: int) -> int:
        """A checkpoint holds every epoch below ``epoch``: delete their fragments; how many went."""
        removed = 0
        for path in self.directory.iterdir() if self.directory.is_dir() else ():
            match = _FRAGMENT.match(path.name)
            if match and int(match.group(1)) < epoch:
                path.unlink(missing_ok=True)
                removed += 1
        return removed

    def acknowledged_by_incarnation(self) -> dict[str, int]:
        """What every incarnation of this run acknowledged (this one included)."""
        counts = {self.incarnation: self.acknowledged}
        for path in self.directory.iterdir() if self.directory.is_dir() else ():
            match = _COUNTS.match(path.name)
            if match and match.group(1) != self.incarnation:
                try:
                    counts[match.group(1)] = int(json.loads(path.read_text())["acknowledged"])
                except (OSError, ValueError, KeyError, TypeError):
                    logger.warning("unreadable acknowledgement count %s", path)
        return counts
