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

The async engine journals the same way; only the epoch is learnt later. A fragment acknowledged
in the stream belongs to no step yet: it is written as ``q-<incarnation>-<n>.frag``; when a step
``s`` takes it from the buffer (to train on it, or to drop it as stale) the entry is renamed
``e<s>-...`` (:meth:`AckJournal.taken`; a rename, atomic). After a crash the resumed engine
(step ``P``) takes back every entry of steps ``>= P`` and every ``q-`` entry, ahead of new work
(:meth:`AckJournal.replay`).

What each incarnation acknowledged (the summary adds up every incarnation of the run) is
derived, not written on the acknowledgement path: an entry's name carries its incarnation and
sequence number, and ``acks-<incarnation>.json`` only records, at each checkpoint and before it
deletes anything, how many entries the incarnation had acknowledged, the highest sequence number
it had handed out and those still being written then. An incarnation's count is that record plus
its entries (in the journal or in quarantine) the record does not cover. Before a checkpoint
deletes entries it folds every other incarnation's uncovered entries into that incarnation's
record (the others are dead: one rank 0 runs at a time), so no deleted entry goes uncounted.

:meth:`AckJournal.record` is called by the pushes themselves, concurrently and outside the
coordinator's lock: each writes and syncs its own entry and nothing else, so pushes arriving
together share the file system's journal commit (ext4 merges concurrent ``fsync`` calls into one)
instead of queueing behind one lock for syncs of their own, which capped a job at
~1 / (2 x fsync) fragments per second. One sync per acknowledged fragment. The entry is written
from the received bytes that the decoded tensors view (``wire.fragment_pieces``, one ``writev``):
no copy of the tensors on rank 0 beyond the one gRPC's parse makes.

Each entry names the worker that pushed it (its public name) and the task's public part. An
entry the coordinator will not train on when it takes it back (``Coordinator._take_back``) is
quarantined: moved, as it is, to ``<run>/quarantine/`` beside a ``.json`` note (worker, task,
reason), and so dropped from the journal for good.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from rlkube._proto import policy_group_pb2 as pb
from rlkube.coordinator.wire import fragment_from_proto, fragment_pieces
from rlkube.data.fragment import Fragment

logger = logging.getLogger(__name__)

JOURNAL_DIR = "acknowledged"
_FRAGMENT = re.compile(r"^e(\d{6,})-([0-9a-zA-Z]+)-(\d{6,})\.frag$")
_QUEUED = re.compile(r"^q-([0-9a-zA-Z]+)-(\d{6,})\.frag$")  # acknowledged in a stream, no step yet
_COUNTS = re.compile(r"^acks-([0-9a-zA-Z]+)\.json$")
_STEM = re.compile(r"^(?:e\d{6,}|q)-([0-9a-zA-Z]+)-(\d{6,})\.frag$")  # any entry: (incarnation, sequence)
_IOV_MAX = 1024  # buffers per writev (Linux's limit)


@dataclass(frozen=True)
class CountRecord:
    """``acks-<incarnation>.json``: ``acknowledged`` entries among sequence numbers up to ``handed_out``,
    not counting those of ``in_flight`` (still being written when the record was made). Pure."""

    acknowledged: int = 0
    handed_out: int = 0
    in_flight: frozenset[int] = frozenset()

    def covers(self, sequence: int) -> bool:
        return sequence <= self.handed_out and sequence not in self.in_flight

    def folded(self, sequences: Iterable[int]) -> CountRecord:
        """A dead incarnation's record with its entries on disk (``sequences``) counted in: exact,
        since it writes nothing more (what was in flight is on disk now, or was never acknowledged)."""
        uncovered = [sequence for sequence in sequences if not self.covers(sequence)]
        if not uncovered:
            return self
        return CountRecord(self.acknowledged + len(uncovered), max(self.handed_out, *uncovered))

    def to_json(self) -> bytes:
        in_flight = sorted(self.in_flight)
        record = {"acknowledged": self.acknowledged, "handedOut": self.handed_out, "inFlight": in_flight}
        return json.dumps(record).encode()

    @classmethod
    def from_json(cls, data: bytes) -> CountRecord:
        record = json.loads(data)
        acknowledged = int(record["acknowledged"])
        # A record without ``handedOut`` (written on every acknowledgement, before this layout) is exact.
        handed_out = int(record.get("handedOut", 1 << 62))
        return cls(acknowledged, handed_out, frozenset(int(s) for s in record.get("inFlight", ())))


def entries_by_incarnation(names: Iterable[str]) -> dict[str, list[int]]:
    """The sequence numbers of the journal entries among ``names``, by incarnation. Pure."""
    found: dict[str, list[int]] = {}
    for name in names:
        match = _STEM.match(name)
        if match:
            found.setdefault(match.group(1), []).append(int(match.group(2)))
    return found


def _write_synced(path: Path, data: bytes | Sequence[bytes | memoryview]) -> None:
    """Write ``data`` (one buffer, or several in order) to ``path`` durably: a synced temp file, renamed."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    try:
        _write_all(fd, [data] if isinstance(data, bytes) else data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _write_all(fd: int, buffers: Sequence[bytes | memoryview]) -> None:
    views = [memoryview(b).cast("B") for b in buffers if len(b)]
    while views:
        written = os.writev(fd, views[:_IOV_MAX])
        while written:  # drop what was written; a short write leaves the rest of a buffer
            if written >= views[0].nbytes:
                written -= views.pop(0).nbytes
            else:
                views[0], written = views[0][written:], 0


class AckJournal:
    """The acknowledged, not yet checkpointed fragments of one job (see the module docstring)."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        incarnation: str,
        quarantine: str | os.PathLike[str] | None = None,
    ) -> None:
        self.directory = Path(directory)
        self.incarnation = incarnation
        #: Where quarantined entries go (default: ``quarantine/`` beside the checkpoints directory).
        self.quarantine_dir = Path(quarantine) if quarantine else self.directory.parent.parent / "quarantine"
        self._origins: dict[str, tuple[str, str]] = {}  # buffer key -> (worker, task) of a taken-back entry
        self.acknowledged = 0  # by this incarnation
        self._written = 0
        self._replayed = 0
        #: buffer key -> (file name now, "<incarnation>-<n>.frag") of entries not yet taken by a step
        self._entries: dict[str, tuple[str, str]] = {}
        self._in_flight: set[int] = set()  # sequence numbers being written now
        self._lock = threading.Lock()  # the counters and names above (never held across a sync)

    def open(self) -> AckJournal:
        self.directory.mkdir(parents=True, exist_ok=True)
        return self

    def record(
        self,
        *,
        epoch: int | None,
        fragment: Fragment,
        key: str = "",
        worker: str = "",
    ) -> None:
        """Make ``fragment`` (acknowledged in ``epoch``; None: in a stream, no step yet) durable.

        Call before acknowledging it; safe to call from several threads at once. ``key``: the
        buffer's id of the fragment (its task id), for :meth:`taken`; its public part is kept with
        ``worker`` (a public name) for quarantine notes.
        """
        with self._lock:
            self._written += 1
            written = self._written
            self._in_flight.add(written)
        try:
            name, stem = self._write_entry(epoch, fragment, key, worker, written)
        except BaseException:
            with self._lock:
                self._in_flight.discard(written)
            raise
        with self._lock:  # counted and no longer in flight at one instant (see _record_counts)
            if key:
                self._entries[key] = (name, stem)
            self.acknowledged += 1
            self._in_flight.discard(written)

    def _write_entry(
        self, epoch: int | None, fragment: Fragment, key: str, worker: str, written: int
    ) -> tuple[str, str]:
        """Write and sync entry number ``written``: (its file name, its stem)."""
        task = key.rsplit(".", 1)[0] if key else f"journal-{written}"
        # The identity fields are the coordinator's: the pusher's worker id is its secret.
        pieces = fragment_pieces(fragment, task_id=task, worker_id=worker, epoch=epoch or 0)
        stem = f"{self.incarnation}-{written:06d}.frag"
        name = f"q-{stem}" if epoch is None else f"e{epoch:06d}-{stem}"
        _write_synced(self.directory / name, pieces)
        return name, stem

    def _count_path(self, incarnation: str) -> Path:
        return self.directory / f"acks-{incarnation}.json"

    def _read_record(self, incarnation: str) -> CountRecord:
        path = self._count_path(incarnation)
        try:
            return CountRecord.from_json(path.read_bytes())
        except FileNotFoundError:
            return CountRecord()
        except (OSError, ValueError, KeyError, TypeError):
            logger.warning("unreadable acknowledgement count %s", path)
            return CountRecord()

    def _entry_names(self) -> list[str]:
        quarantined = list(self.quarantine_dir.iterdir()) if self.quarantine_dir.is_dir() else []
        return [path.name for path in [*self._listing(), *quarantined]]

    def _others(self) -> dict[str, tuple[CountRecord, CountRecord]]:
        """Every other incarnation: its count record as stored, and folded with its entries on disk."""
        entries = entries_by_incarnation(self._entry_names())
        recorded = {m.group(1) for path in self._listing() if (m := _COUNTS.match(path.name))}
        others = {}
        for incarnation in (recorded | set(entries)) - {self.incarnation}:
            stored = self._read_record(incarnation)
            others[incarnation] = (stored, stored.folded(entries.get(incarnation, [])))
        return others

    def _record_counts(self) -> None:
        """Before entries are deleted: this incarnation's count record, and every dead one's folded."""
        with self._lock:
            own = CountRecord(self.acknowledged, self._written, frozenset(self._in_flight))
        _write_synced(self._count_path(self.incarnation), own.to_json())
        for incarnation, (stored, folded) in self._others().items():
            if folded != stored:
                _write_synced(self._count_path(incarnation), folded.to_json())

    def taken(self, *, epoch: int, keys: Iterable[str]) -> None:
        """Step ``epoch`` took the fragments ``keys`` (trained on or dropped): file them under it."""
        for key in keys:
            with self._lock:
                entry = self._entries.pop(key, None)
            if entry is None:  # not journalled (no journal when it was acknowledged)
                continue
            name, stem = entry
            target = f"e{epoch:06d}-{stem}"
            if name != target:
                os.replace(self.directory / name, self.directory / target)

    def _listing(self) -> list[Path]:
        return list(self.directory.iterdir()) if self.directory.is_dir() else []

    def replay(self, *, epoch: int | None = None, since: int | None = None) -> list[tuple[str, Fragment]]:
        """Journalled fragments to take back, each with a fresh buffer key (tracked for :meth:`taken`).

        ``epoch``: the entries of that epoch (sync); ``since``: those of every step ``>= since`` and
        every one of no step yet, oldest step first (async).
        """
        found: list[tuple[tuple[int, str], Path, str]] = []
        for path in self._listing():
            match = _FRAGMENT.match(path.name)
            if match:
                step, stem = int(match.group(1)), f"{match.group(2)}-{match.group(3)}.frag"
                wanted = step == epoch if epoch is not None else since is not None and step >= since
                if wanted:
                    found.append(((step, path.name), path, stem))
                continue
            queued = _QUEUED.match(path.name)
            if queued and epoch is None and since is not None:
                found.append(((1 << 62, path.name), path, path.name.removeprefix("q-")))
        taken_back = []
        for _, path, stem in sorted(found, key=lambda item: item[0]):
            try:
                message = pb.Fragment.FromString(path.read_bytes())
                fragment = fragment_from_proto(message)
            except (OSError, ValueError) as exc:  # a torn file cannot have been acknowledged
                logger.warning("skipping unreadable journal entry %s: %s", path, exc)
                continue
            with self._lock:
                self._replayed += 1
                key = f"{self.incarnation}-replay-{self._replayed}"
                self._entries[key] = (path.name, stem)
            self._origins[key] = (message.worker_id, message.task_id)
            taken_back.append((key, fragment))
        return taken_back

    def origin(self, key: str) -> tuple[str, str]:
        """(worker, task) that pushed the taken-back entry ``key``; empty strings when not recorded."""
        return self._origins.get(key, ("", ""))

    def quarantine(self, key: str, *, reason: str) -> Path:
        """Move the entry of ``key`` out of the journal into the quarantine directory, with a note."""
        with self._lock:
            name, _ = self._entries.pop(key)
        worker, task = self._origins.pop(key, ("", ""))
        self.quarantine_dir.mkdir(parents=True, exist_ok=True)
        target = self.quarantine_dir / name
        shutil.move(self.directory / name, target)  # out of the journal first: never replayed again
        note = {"worker": worker, "task": task, "reason": reason, "journal_entry": name}
        _write_synced(target.with_name(f"{name}.json"), json.dumps(note, indent=2).encode())
        return target

    def quarantined(self) -> int:
        """Entries quarantined over the run's life (every incarnation: the notes in the directory)."""
        if not self.quarantine_dir.is_dir():
            return 0
        return sum(1 for path in self.quarantine_dir.iterdir() if path.name.endswith(".frag.json"))

    def pending(self, epoch: int) -> list[Fragment]:
        """The journalled fragments of ``epoch`` (any incarnation), in the order they were written."""
        return [fragment for _, fragment in self.replay(epoch=epoch)]

    def checkpointed(self, epoch: int) -> int:
        """A checkpoint holds every epoch below ``epoch``: delete their fragments; how many went."""
        self._record_counts()
        removed = 0
        for path in self._listing():
            match = _FRAGMENT.match(path.name)
            if match and int(match.group(1)) < epoch:
                path.unlink(missing_ok=True)
                removed += 1
        return removed

    def acknowledged_by_incarnation(self) -> dict[str, int]:
        """What every incarnation of this run acknowledged (this one included)."""
        counts = {self.incarnation: self.acknowledged}
        for incarnation, (_, folded) in self._others().items():
            counts[incarnation] = folded.acknowledged
        return counts
