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

``acks-<incarnation>.json`` counts what each incarnation acknowledged, so the summary can add
up every incarnation of the run.

:meth:`AckJournal.record` is called by the pushes themselves, concurrently and outside the
coordinator's lock: each writes and syncs its own entry, so pushes arriving together share the
file system's journal commit (ext4 merges concurrent ``fsync`` calls into one) instead of queueing
behind one lock for two syncs each, which capped a job at ~1 / (2 x fsync) fragments per second.
The count file is rewritten by one push at a time, and a push that finds it already covering its
entry (written by another push meanwhile) skips it: one sync per group, not per fragment. The
entry is the received message's batch as it came (no second encoding of the tensors).

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
from collections.abc import Iterable
from pathlib import Path

from rlkube._proto import policy_group_pb2 as pb
from rlkube.coordinator.wire import fragment_from_proto, fragment_to_proto
from rlkube.data.fragment import Fragment

logger = logging.getLogger(__name__)

JOURNAL_DIR = "acknowledged"
_FRAGMENT = re.compile(r"^e(\d{6,})-([0-9a-zA-Z]+)-(\d{6,})\.frag$")
_QUEUED = re.compile(r"^q-([0-9a-zA-Z]+)-(\d{6,})\.frag$")  # acknowledged in a stream, no step yet
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
        self._lock = threading.Lock()  # the counters and names above (never held across a sync)
        self._count_lock = threading.Lock()  # one writer of the count file at a time
        self._count_written = 0  # what the count file on disk says

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
        received: pb.Fragment | None = None,
    ) -> None:
        """Make ``fragment`` (acknowledged in ``epoch``; None: in a stream, no step yet) durable.

        Call before acknowledging it; safe to call from several threads at once. ``key``: the
        buffer's id of the fragment (its task id), for :meth:`taken`; its public part is kept with
        ``worker`` (a public name) for quarantine notes. ``received``: the message ``fragment`` was
        decoded from, whose batch is written as it is instead of encoding the tensors again.
        """
        with self._lock:
            self._written += 1
            written = self._written
        task = key.rsplit(".", 1)[0] if key else f"journal-{written}"
        if received is not None:  # the identity fields are rewritten: the worker id is the worker's secret
            message = pb.Fragment(
                task_id=task,
                worker_id=worker,
                weight_version=received.weight_version,
                epoch=epoch or 0,
                batch=received.batch,
                episodes=received.episodes,
                env_steps=fragment.env_steps,
            )
        else:
            message = fragment_to_proto(fragment, task_id=task, worker_id=worker, epoch=epoch or 0)
        stem = f"{self.incarnation}-{written:06d}.frag"
        name = f"q-{stem}" if epoch is None else f"e{epoch:06d}-{stem}"
        _write_synced(self.directory / name, message.SerializeToString())
        with self._lock:
            if key:
                self._entries[key] = (name, stem)
            self.acknowledged += 1
        self._write_count()

    def _write_count(self) -> None:
        """Make the count file cover every entry synced so far (one sync serves every waiting push)."""
        with self._count_lock:
            with self._lock:
                count = self.acknowledged
            if count <= self._count_written:
                return
            _write_synced(
                self.directory / f"acks-{self.incarnation}.json", json.dumps({"acknowledged": count}).encode()
            )
            self._count_written = count

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
        for path in self.directory.iterdir() if self.directory.is_dir() else ():
            match = _COUNTS.match(path.name)
            if match and match.group(1) != self.incarnation:
                try:
                    counts[match.group(1)] = int(json.loads(path.read_text())["acknowledged"])
                except (OSError, ValueError, KeyError, TypeError):
                    logger.warning("unreadable acknowledgement count %s", path)
        return counts
