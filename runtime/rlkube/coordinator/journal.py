"""The acknowledgement journal: what a worker was told is accepted survives a crash of rank 0.

I/O (files next to the checkpoints, in ``<checkpoints>/acknowledged/``). The coordinator appends
every fragment it acknowledges to the journal (an *entry*: the wire encoding of
:mod:`rlkube.coordinator.wire`, a manifest plus raw bytes, no pickle) and waits for it to be
durable *before* the worker hears "accepted". The files are append-only segments of checksummed
records (:mod:`rlkube.coordinator.journal_log`); each entry is known by its incarnation and a
sequence number, and belongs to a step: the sync epoch it was acknowledged in. A checkpoint of
epoch ``P`` (``P`` epochs trained) makes the entries of steps ``< P`` redundant; a segment is
deleted once every entry in it is.

After a crash, rank 0 resumes from its newest checkpoint (epoch ``P``) and, as it opens each
epoch ``e >= P``, takes the journalled fragments of ``e`` back into the epoch's batch and queues
only the missing tasks. So every acknowledged fragment is trained on exactly once in the run's
surviving history — also one the dead incarnation had trained on after its last checkpoint,
since that training was lost with it. (Such a fragment was collected with weights the new
incarnation never had; PPO's clipped ratio, computed against the log-probabilities stored with
the fragment, treats it as mildly off-policy data.)

The async engine journals the same way; only the step is learnt later. A fragment acknowledged
in the stream belongs to no step yet; when a step ``s`` takes it from the buffer (to train on
it, or to drop it as stale) a *taken* marker files it under ``s`` (:meth:`AckJournal.taken`;
made durable by the pushes' syncs or, at the latest, before a checkpoint is saved:
:meth:`AckJournal.durable`, so no checkpoint holds a step whose marker could be lost). After a
crash the resumed engine (step ``P``) takes back every entry of steps ``>= P`` and every entry
of no step, ahead of new work (:meth:`AckJournal.replay`). Markers are applied in the order
they were written (segment number, then offset); when a checkpoint deletes segments, the state
of every entry that lives on is written again first, so no marker is lost with its segment.

What each incarnation acknowledged (the summary adds up every incarnation of the run) is
derived, not written on the acknowledgement path: an entry carries its incarnation and
sequence number, and ``acks-<incarnation>.json`` only records, at each checkpoint and before it
deletes anything, how many entries the incarnation had acknowledged, the highest sequence number
it had handed out and those still being written then. An incarnation's count is that record plus
its entries (in the journal or in quarantine) the record does not cover. Before a checkpoint
deletes entries it folds every other incarnation's uncovered entries into that incarnation's
record (the others are dead: one rank 0 runs at a time), so no deleted entry goes uncounted.

:meth:`AckJournal.record` is called by the pushes themselves, concurrently and outside the
coordinator's lock: each appends its entry (one ``writev`` from the received bytes that the
decoded tensors view: no copy) and waits for a sync covering it; pushes arriving together share
one ``fdatasync``. If a sync fails the run ends with the error (the coordinator stops
acknowledging); the entries that sync covered were never acknowledged but may be on disk, and a
restarted rank 0 takes them back like any other (their tasks were not trained).

Each entry names the worker that pushed it (its public name) and the task's public part. An
entry the coordinator will not train on when it takes it back (``Coordinator._take_back``) is
quarantined: copied, as it is, to ``<run>/quarantine/`` beside a ``.json`` note (worker, task,
reason), and dropped from the journal for good by a marker.

Journals written before segments (a file per entry, ``e<step>-<incarnation>-<n>.frag`` and
``q-<incarnation>-<n>.frag``) are moved into segments of their incarnations when opened.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from google.protobuf.message import DecodeError

from rlkube.coordinator import journal_log as log
from rlkube.coordinator.journal_log import Kind, Segment
from rlkube.coordinator.wire import ReceivedPush, fragment_from_proto, fragment_pieces, read_push
from rlkube.data.fragment import Fragment

logger = logging.getLogger(__name__)

JOURNAL_DIR = "acknowledged"
_FRAGMENT = re.compile(r"^e(\d{6,})-([0-9a-zA-Z]+)-(\d{6,})\.frag$")  # before segments
_QUEUED = re.compile(r"^q-([0-9a-zA-Z]+)-(\d{6,})\.frag$")  # before segments: acknowledged, no step yet
_COUNTS = re.compile(r"^acks-([0-9a-zA-Z]+)\.json$")
_STEM = re.compile(r"^(?:e\d{6,}|q)-([0-9a-zA-Z]+)-(\d{6,})\.frag$")  # any entry: (incarnation, sequence)

EntryId = tuple[str, int]  # (incarnation, sequence number)


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
        uncovered = [sequence for sequence in set(sequences) if not self.covers(sequence)]
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
    """The sequence numbers of the entries named ``names`` (quarantined copies), by incarnation. Pure."""
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
        log.write_all(fd, [data] if isinstance(data, bytes) else data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


@dataclass
class _Entry:
    """What the journal knows of one entry: where it lies, and its state with every marker applied."""

    incarnation: str
    sequence: int
    segment: Path
    record: log.Record
    step: int | None  # the step it belongs to now (None: none yet)
    dropped: bool = False  # quarantined
    retired: bool = False  # a checkpoint holds its step
    in_flight: bool = False  # being written or synced: not acknowledged yet

    @property
    def name(self) -> str:
        stem = f"{self.incarnation}-{self.sequence:06d}.frag"
        return f"q-{stem}" if self.step is None else f"e{self.step:06d}-{stem}"

    @property
    def live(self) -> bool:
        """Taken back by a restart (acknowledged, neither quarantined nor held by a checkpoint)."""
        return not (self.dropped or self.retired or self.in_flight)

    @property
    def moved(self) -> bool:
        """Its state differs from its own record (a marker says so)."""
        return self.dropped or self.step != self.record.step


@dataclass(eq=False)
class PendingEntry:
    """An entry written by :meth:`AckJournal.append`, durable once ``segment`` is synced through ``end``."""

    sequence: int
    key: str
    segment: Segment
    end: int

    @property
    def durable(self) -> bool:
        return self.segment.synced >= self.end


def _close_segments(segments: list[Segment]) -> None:
    for segment in segments:
        segment.close()


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
        self._entries: dict[EntryId, _Entry] = {}  # every entry in the segments on disk
        self._keys: dict[str, EntryId] = {}  # buffer key -> entry, until a step takes it
        self._in_flight: set[int] = set()  # sequence numbers being written now
        self._checkpoint = 0  # every step below it is held by a checkpoint
        self._numbers: dict[Path, int] = {}  # segment -> its number
        self._active: Segment | None = None  # the segment appended to (created on the first append)
        self._open: list[Segment] = []  # this incarnation's segments with a descriptor open
        self._unsynced: list[tuple[Segment, int]] = []  # markers appended, not yet waited for
        self._lock = threading.Lock()  # the state above (never held across a sync)
        self._append = threading.Lock()  # the active segment's tail (held across a writev only)
        self._closer = weakref.finalize(self, _close_segments, self._open)

    def open(self, *, read_only: bool = False) -> AckJournal:
        """Read what is on disk. ``read_only``: change nothing (no directory made, an older
        journal's files left as they are): for looking at a run's journal, never for writing it."""
        if not read_only:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._adopt_entry_files()
        self._scan()
        return self

    def segment_files(self) -> list[Path]:
        """The segments on disk, oldest first."""
        return [path for _, _, path in log.segments(self.directory)]

    def entry_files(self) -> list[Path]:
        """Entries of an older rlkube (a file each), not yet moved into segments."""
        if not self.directory.is_dir():
            return []
        return [p for p in self.directory.iterdir() if _FRAGMENT.match(p.name) or _QUEUED.match(p.name)]

    @property
    def checkpoint(self) -> int:
        """Every step below it is held by a checkpoint (as far as the journal knows)."""
        return self._checkpoint

    def close(self) -> None:
        """Close this incarnation's segments (a journal is also closed when it is collected)."""
        self._closer()

    # ----------------------------------------------------------------- reading the segments
    def _scan(self) -> None:
        for number, incarnation, path in log.segments(self.directory):
            self._numbers[path] = number
            for record in log.scan(path):
                self._apply(incarnation, path, record)
            if incarnation == self.incarnation:  # reopened: go on numbering after its entries
                own = [e.sequence for e in self._entries.values() if e.incarnation == incarnation]
                self._written = max([self._written, *own])
        for entry in self._entries.values():
            entry.retired = entry.step is not None and entry.step < self._checkpoint

    def _apply(self, incarnation: str, path: Path, record: log.Record) -> None:
        if record.kind is Kind.ENTRY:
            self._entries[(incarnation, record.sequence)] = _Entry(
                incarnation, record.sequence, path, record, record.step
            )
        elif record.kind is Kind.CHECKPOINT:
            self._checkpoint = max(self._checkpoint, record.step or 0)
        else:
            try:
                ids = [(str(i), int(s)) for i, s in json.loads(record.body or b"[]")]
            except (ValueError, TypeError) as exc:
                logger.warning("journal segment %s: unreadable marker (%s); ignored", path, exc)
                return
            for entry_id in ids:
                entry = self._entries.get(entry_id)
                if entry is None:  # its segment is gone: a checkpoint held it
                    continue
                if record.kind is Kind.TAKEN:
                    entry.step = record.step
                else:
                    entry.dropped = True

    def _adopt_entry_files(self) -> None:
        """Move a journal of a file per entry (written before segments) into segments, one per
        incarnation, keeping each entry's incarnation, sequence number and step."""
        found: dict[str, list[tuple[int, int | None, Path]]] = {}
        for path in self.directory.iterdir():
            if match := _FRAGMENT.match(path.name):
                found.setdefault(match.group(2), []).append((int(match.group(3)), int(match.group(1)), path))
            elif match := _QUEUED.match(path.name):
                found.setdefault(match.group(1), []).append((int(match.group(2)), None, path))
        for incarnation, entries in sorted(found.items()):
            buffers: list[memoryview] = []
            for sequence, step, path in sorted(entries, key=lambda item: item[0]):
                buffers += log.encode_record(
                    Kind.ENTRY, sequence=sequence, step=step, body=[path.read_bytes()]
                )
            _write_synced(self.directory / log.segment_name(self._next_number(), incarnation), buffers)
            for _, _, path in entries:
                path.unlink()
            logger.info("journal: %d entries of %s moved into a segment", len(entries), incarnation)

    def _next_number(self) -> int:
        numbers = [number for number, _, _ in log.segments(self.directory)]
        return 1 + max([0, *numbers, *list(self._numbers.values())])

    # ----------------------------------------------------------------- appending
    def _append_record(
        self, kind: Kind, *, sequence: int = 0, step: int | None, body: Sequence[bytes | memoryview]
    ) -> tuple[Segment, int]:
        """Append one record to this incarnation's segment: (the segment, the record's end)."""
        buffers = log.encode_record(kind, sequence=sequence, step=step, body=body)
        with self._append:
            segment = self._active
            if segment is None or segment.broken is not None:
                segment = self._active = self._new_segment()
            end = segment.append(buffers)
            if kind is Kind.ENTRY:
                record = log.appended(buffers, end)
                with self._lock:
                    self._entries[(self.incarnation, sequence)] = _Entry(
                        self.incarnation, sequence, segment.path, record, step, in_flight=True
                    )
        return segment, end

    def _new_segment(self) -> Segment:
        while True:
            number = self._next_number()
            path = self.directory / log.segment_name(number, self.incarnation)
            try:
                segment = Segment(path)
            except FileExistsError:  # another journal took the number (it is listed now): the next
                continue
            self._numbers[path] = number
            self._open.append(segment)
            log.sync_directory(self.directory)
            return segment

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
        ``worker`` (a public name) for quarantine notes. The blocking form of :meth:`append`, a
        sync covering it, then :meth:`settle`.
        """
        pending = self.append(epoch=epoch, fragment=fragment, key=key, worker=worker)
        try:
            pending.segment.sync_through(pending.end)
        except BaseException:
            self.abandon(pending)
            raise
        self.settle(pending)

    def append(
        self, *, epoch: int | None, fragment: Fragment, key: str = "", worker: str = ""
    ) -> PendingEntry:
        """Write ``fragment``'s entry, not yet durable: make it so (``pending.segment.sync_through``),
        then :meth:`settle` it before acknowledging; on a failed sync, :meth:`abandon` it."""
        with self._lock:
            self._written += 1
            sequence = self._written
            self._in_flight.add(sequence)
        try:
            task = key.rsplit(".", 1)[0] if key else f"journal-{sequence}"
            # The identity fields are the coordinator's: the pusher's worker id is its secret.
            body = fragment_pieces(fragment, task_id=task, worker_id=worker, epoch=epoch or 0)
            segment, end = self._append_record(Kind.ENTRY, sequence=sequence, step=epoch, body=body)
        except BaseException:
            self._forget(sequence)
            raise
        return PendingEntry(sequence=sequence, key=key, segment=segment, end=end)

    def settle(self, pending: PendingEntry) -> None:
        """``pending`` is durable: it counts as acknowledged from now on."""
        entry_id = (self.incarnation, pending.sequence)
        with self._lock:  # counted and no longer in flight at one instant (see _record_counts)
            self._entries[entry_id].in_flight = False
            if pending.key:
                self._keys[pending.key] = entry_id
            self.acknowledged += 1
            self._in_flight.discard(pending.sequence)

    def abandon(self, pending: PendingEntry) -> None:
        """``pending`` will not be acknowledged (its sync failed)."""
        self._forget(pending.sequence)

    def _forget(self, sequence: int) -> None:
        with self._lock:
            self._in_flight.discard(sequence)
            self._entries.pop((self.incarnation, sequence), None)

    def _mark(self, kind: Kind, ids: Sequence[EntryId], *, step: int | None = None) -> None:
        """Append a marker for ``ids`` and wait for it to be durable."""
        body = json.dumps([[incarnation, sequence] for incarnation, sequence in ids]).encode()
        segment, end = self._append_record(kind, step=step, body=[body])
        segment.sync_through(end)

    def taken(self, *, epoch: int, keys: Iterable[str]) -> None:
        """Step ``epoch`` took the fragments ``keys`` (trained on or dropped): file them under it.

        The marker is appended, not waited for (the pushes' syncs soon cover it): :meth:`durable`
        must be called before a checkpoint that holds step ``epoch`` is saved.
        """
        moved = []
        with self._lock:
            for key in keys:
                entry = self._entries.get(self._keys.pop(key, ("", 0)))
                if entry is None:  # not journalled (no journal when it was acknowledged)
                    continue
                if entry.step != epoch:
                    entry.step = epoch
                    moved.append((entry.incarnation, entry.sequence))
        if moved:
            body = json.dumps([[incarnation, sequence] for incarnation, sequence in moved]).encode()
            written = self._append_record(Kind.TAKEN, step=epoch, body=[body])
            with self._lock:
                self._unsynced.append(written)

    def durable(self) -> None:
        """Every marker appended so far is on disk (before a checkpoint is saved: see :meth:`taken`)."""
        with self._lock:
            unsynced, self._unsynced = self._unsynced, []
        for segment, end in unsynced:
            segment.sync_through(end)

    # ----------------------------------------------------------------- taking entries back
    def replay(self, *, epoch: int | None = None, since: int | None = None) -> list[tuple[str, Fragment]]:
        """Journalled fragments to take back, each with a fresh buffer key (tracked for :meth:`taken`).

        ``epoch``: the entries of that epoch (sync); ``since``: those of every step ``>= since`` and
        every one of no step yet, oldest step first (async).
        """
        with self._lock:
            wanted = [
                entry
                for entry in self._entries.values()
                if entry.live
                and (
                    entry.step == epoch
                    if epoch is not None
                    else since is not None and (entry.step is None or entry.step >= since)
                )
            ]
            wanted.sort(
                key=lambda e: (
                    1 << 62 if e.step is None else e.step,
                    self._numbers.get(e.segment, 0),
                    e.record.offset,
                )
            )
        taken_back = []
        for entry in wanted:
            try:
                read = read_push(log.read_body(entry.segment, entry.record))  # an entry is a push's bytes
                fragment = fragment_from_proto(read)
            except (OSError, ValueError, DecodeError) as exc:  # a torn record cannot have been acknowledged
                logger.warning("skipping unreadable journal entry %s: %s", entry.name, exc)
                continue
            with self._lock:
                self._replayed += 1
                key = f"{self.incarnation}-replay-{self._replayed}"
                self._keys[key] = (entry.incarnation, entry.sequence)
            message = read.message if isinstance(read, ReceivedPush) else read
            self._origins[key] = (message.worker_id, message.task_id)
            taken_back.append((key, fragment))
        return taken_back

    def origin(self, key: str) -> tuple[str, str]:
        """(worker, task) that pushed the taken-back entry ``key``; empty strings when not recorded."""
        return self._origins.get(key, ("", ""))

    def quarantine(self, key: str, *, reason: str) -> Path:
        """Copy the entry of ``key`` into the quarantine directory, with a note, and drop it from the
        journal (a marker: never taken back again)."""
        with self._lock:
            entry = self._entries[self._keys.pop(key)]
        worker, task = self._origins.pop(key, ("", ""))
        self.quarantine_dir.mkdir(parents=True, exist_ok=True)
        target = self.quarantine_dir / entry.name
        with open(entry.segment, "rb") as handle:
            body = os.pread(handle.fileno(), entry.record.length, entry.record.offset)
        _write_synced(target, body)
        note = {"worker": worker, "task": task, "reason": reason, "journal_entry": entry.name}
        _write_synced(target.with_name(f"{entry.name}.json"), json.dumps(note, indent=2).encode())
        self._mark(Kind.DROPPED, [(entry.incarnation, entry.sequence)])
        with self._lock:
            entry.dropped = True
        return target

    def quarantined(self) -> int:
        """Entries quarantined over the run's life (every incarnation: the notes in the directory)."""
        if not self.quarantine_dir.is_dir():
            return 0
        return sum(1 for path in self.quarantine_dir.iterdir() if path.name.endswith(".frag.json"))

    def pending(self, epoch: int) -> list[Fragment]:
        """The journalled fragments of ``epoch`` (any incarnation), in the order they were written."""
        return [fragment for _, fragment in self.replay(epoch=epoch)]

    def held(self) -> dict[int | None, int]:
        """How many entries a restart would take back, by step (None: no step yet)."""
        counts: dict[int | None, int] = {}
        with self._lock:
            for entry in self._entries.values():
                if entry.live:
                    counts[entry.step] = counts.get(entry.step, 0) + 1
        return counts

    # ----------------------------------------------------------------- checkpoints and counts
    def checkpointed(self, epoch: int) -> int:
        """A checkpoint holds every epoch below ``epoch``: their entries are redundant, and the
        segments that hold nothing else are deleted. How many entries it made redundant."""
        self.durable()
        self._record_counts()
        with self._append:  # later appends go to a new segment; this one may be deleted in time
            self._active = None
            candidates = set(self._numbers)  # segments made from now on are never deleted here
        with self._lock:
            self._checkpoint = max(self._checkpoint, epoch)
            removed = 0
            for entry in self._entries.values():
                if not entry.retired and entry.step is not None and entry.step < self._checkpoint:
                    entry.retired = True
                    removed += 1
            kept = {e.segment for e in self._entries.values() if not (e.dropped or e.retired)}
            doomed = candidates - kept
            carried = [e for e in self._entries.values() if e.segment in kept and e.moved]
            checkpoint = self._checkpoint
        # Every marker the kept entries need, written again before any segment goes.
        for step in {e.step for e in carried if not e.dropped}:
            self._mark(
                Kind.TAKEN,
                [(e.incarnation, e.sequence) for e in carried if e.step == step and not e.dropped],
                step=step,
            )
        if any(e.dropped for e in carried):
            self._mark(Kind.DROPPED, [(e.incarnation, e.sequence) for e in carried if e.dropped])
        self._mark(Kind.CHECKPOINT, [], step=checkpoint)
        with self._lock:
            for path in doomed:
                path.unlink(missing_ok=True)
                del self._numbers[path]
            self._entries = {i: e for i, e in self._entries.items() if e.segment not in doomed}
            for segment in [s for s in self._open if s.path in doomed and s.idle()]:
                self._open.remove(segment)
                segment.close()
        if doomed:
            log.sync_directory(self.directory)
        return removed

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

    def _sequences(self) -> dict[str, set[int]]:
        """Every entry on disk (in a segment, or a quarantined copy), by incarnation."""
        quarantined = [p.name for p in self.quarantine_dir.iterdir()] if self.quarantine_dir.is_dir() else []
        found = {
            incarnation: set(numbers) for incarnation, numbers in entries_by_incarnation(quarantined).items()
        }
        with self._lock:
            for entry in self._entries.values():
                if not entry.in_flight:
                    found.setdefault(entry.incarnation, set()).add(entry.sequence)
        return found

    def _others(self) -> dict[str, tuple[CountRecord, CountRecord]]:
        """Every other incarnation: its count record as stored, and folded with its entries on disk."""
        entries = self._sequences()
        listing = self.directory.iterdir() if self.directory.is_dir() else iter(())
        recorded = {m.group(1) for path in listing if (m := _COUNTS.match(path.name))}
        others = {}
        for incarnation in (recorded | set(entries)) - {self.incarnation}:
            stored = self._read_record(incarnation)
            others[incarnation] = (stored, stored.folded(entries.get(incarnation, ())))
        return others

    def _record_counts(self) -> None:
        """Before entries are deleted: this incarnation's count record, and every dead one's folded."""
        with self._lock:
            own = CountRecord(self.acknowledged, self._written, frozenset(self._in_flight))
        _write_synced(self._count_path(self.incarnation), own.to_json())
        for incarnation, (stored, folded) in self._others().items():
            if folded != stored:
                _write_synced(self._count_path(incarnation), folded.to_json())

    def acknowledged_by_incarnation(self) -> dict[str, int]:
        """What every incarnation of this run acknowledged (this one included)."""
        counts = {self.incarnation: self.acknowledged}
        for incarnation, (_, folded) in self._others().items():
            counts[incarnation] = folded.acknowledged
        return counts
