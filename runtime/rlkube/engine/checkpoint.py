"""Checkpoints: written atomically, verified on load, the newest valid one resumed.

I/O: reads and writes the checkpoint directory. One checkpoint is a directory ``ckpt-<epoch>``
holding ``policy.pt`` (written by ``policy.save_checkpoint``, so a user's override is honoured),
``trainer.pt`` (optimizer and LR-scheduler states from ``policy.optimizers()``, and the RNG
states of python, numpy and torch) and ``meta.json`` (epoch, env steps, weight version, the run's
history, and the size and xxh3 digest of both files). It is assembled in a temporary directory
and renamed into place, so a reader sees a whole checkpoint or none; a checkpoint whose files do
not match their digests is moved aside to ``ckpt-<epoch>.corrupt`` (named in a warning and in
:attr:`CheckpointStore.moved_aside`) and the next older one is used.

Pruning keeps the ``keep`` newest checkpoints that verify, so it never deletes the newest valid
one, however many corrupt ones carry higher epoch numbers (those are moved aside, not counted).
A save that the file system refuses (no space, read-only, no permission) raises
:class:`~rlkube.engine.disk.DiskFault`, one line naming the checkpoint; the previous checkpoints
are untouched, since nothing is pruned or renamed before a new one is complete.

Everything loads with ``map_location="cpu"``, so every train rank (and a machine without the
writer's accelerator) can load the same file; ``policy.load_checkpoint`` and the optimizers'
``load_state_dict`` move state to their own devices. Next to the checkpoints, ``COMPLETE.json``
marks a finished job: a restarted run that finds it does not train again.

A policy that overrides ``save_checkpoint`` without ``load_checkpoint``
(``BasePolicy.saves_custom_checkpoints``) also gets ``models.pt``, the framework's own copy of its
``model_list``, and resumes from that: the default loader cannot read a format it did not write.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import re
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import xxhash

from rlkube.engine.disk import DiskFault, as_disk_fault, check_writable, out_of_space
from rlkube.policy.base import BasePolicy

logger = logging.getLogger(__name__)

FORMAT = 1
POLICY_FILE = "policy.pt"
TRAINER_FILE = "trainer.pt"
MODELS_FILE = "models.pt"
META_FILE = "meta.json"
COMPLETE_FILE = "COMPLETE.json"
#: A checkpoint that failed verification is renamed ``ckpt-<epoch><CORRUPT_SUFFIX>`` (kept to look at).
CORRUPT_SUFFIX = ".corrupt"
_NAME = re.compile(r"^ckpt-(\d{6,})$")


@dataclass(frozen=True)
class TrainerProgress:
    """Where a run stands: what a checkpoint restores besides weights, optimizers and RNG."""

    epoch: int = 0  # epochs completed
    env_steps: int = 0
    weight_version: int = 0
    wall_seconds: float = 0.0  # over every run of this job so far
    episodes: tuple[tuple[int, float, int], ...] = ()  # (env steps when recorded, return, length)
    evaluations: tuple[tuple[int, int, float], ...] = ()  # (epoch, env steps, mean return)
    env_steps_to_target: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["episodes"] = [list(e) for e in self.episodes]
        data["evaluations"] = [list(e) for e in self.evaluations]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TrainerProgress:
        return cls(
            epoch=int(data["epoch"]),
            env_steps=int(data["env_steps"]),
            weight_version=int(data["weight_version"]),
            wall_seconds=float(data.get("wall_seconds", 0.0)),
            episodes=tuple((int(s), float(r), int(n)) for s, r, n in data.get("episodes", [])),
            evaluations=tuple((int(e), int(s), float(r)) for e, s, r in data.get("evaluations", [])),
            env_steps_to_target=data.get("env_steps_to_target"),
            extra=dict(data.get("extra", {})),
        )


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    progress: TrainerProgress


class CheckpointError(RuntimeError):
    """A checkpoint that is incomplete or does not match its digests."""


def _digest(path: Path) -> str:
    hasher = xxhash.xxh3_64()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            hasher.update(chunk)
    return hasher.hexdigest()


def _fsync(path: Path) -> None:
    with path.open("rb") as handle:
        os.fsync(handle.fileno())


def capture_rng() -> dict[str, Any]:
    """Python, numpy and torch RNG states, in types ``torch.load(weights_only=True)`` accepts."""
    np_state = np.random.get_state(legacy=False)
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {
            "bit_generator": np_state["bit_generator"],
            "key": torch.from_numpy(np_state["state"]["key"].astype(np.int64)),
            "pos": int(np_state["state"]["pos"]),
            "has_gauss": int(np_state["has_gauss"]),
            "gauss": float(np_state["gauss"]),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        # This rank's own device only: ``get_rng_state_all`` would open a CUDA context on every
        # visible GPU, and a resume may see a different number of them.
        state["cuda"] = [torch.cuda.get_rng_state()]
    return state


def restore_rng(state: dict[str, Any]) -> None:
    random.setstate(_as_python_rng(state["python"]))
    np_state = state["numpy"]
    np.random.set_state(
        {
            "bit_generator": np_state["bit_generator"],
            "state": {"key": np_state["key"].numpy().astype(np.uint32), "pos": np_state["pos"]},
            "has_gauss": np_state["has_gauss"],
            "gauss": np_state["gauss"],
        }
    )
    torch.set_rng_state(state["torch"])
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"][0])  # onto this rank's device (see capture_rng)


def _as_python_rng(value: Any) -> tuple[Any, ...]:
    version, internal, gauss = value
    return (version, tuple(internal), gauss)


class CheckpointStore:
    """The checkpoints of one job in ``directory``; keeps the ``keep`` newest."""

    def __init__(self, directory: str | os.PathLike[str], *, keep: int = 3) -> None:
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        self.directory = Path(directory)
        self.keep = keep
        #: (checkpoint, where it was moved) for every corrupt checkpoint this store moved aside
        self.moved_aside: list[tuple[Path, Path]] = []
        # Checkpoints this store wrote or verified: pruning reads only the others (a restarted
        # rank 0 reads each once), so a save costs no re-hash of the checkpoints it keeps.
        self._verified: set[Path] = set()

    def check_writable(self) -> Path:
        """Prove the directory takes a file now (before training), or raise a one-line DiskFault."""
        return check_writable(self.directory, what="checkpoint directory")

    # ------------------------------------------------------------------ writing
    def save(self, policy: BasePolicy, progress: TrainerProgress) -> Path:
        """Write ``ckpt-<epoch>`` atomically and prune old ones; returns its path.

        Raises :class:`~rlkube.engine.disk.DiskFault` when the file system refuses the write.
        """
        final = self.directory / f"ckpt-{progress.epoch:06d}"
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DiskFault("checkpoint directory", self.directory, exc) from None
        self._write(policy, progress, final)
        self._remember_valid(final)
        self._prune()
        return final

    def _write(self, policy: BasePolicy, progress: TrainerProgress, final: Path) -> None:
        tmp = self.directory / f".tmp-{final.name}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            tmp.mkdir()
            policy.save_checkpoint(str(tmp / POLICY_FILE))
            custom = policy.saves_custom_checkpoints()
            if custom:
                policy.save_models(tmp / MODELS_FILE)
            trainer_state = {
                "optimizers": {name: opt.state_dict() for name, opt in policy.optimizers().items()},
                "rng": capture_rng(),
            }
            torch.save(trainer_state, tmp / TRAINER_FILE)
            files = {}
            for name in (POLICY_FILE, TRAINER_FILE, *((MODELS_FILE,) if custom else ())):
                if not (tmp / name).is_file():
                    raise CheckpointError(f"{type(policy).__name__}.save_checkpoint wrote no {name}")
                _fsync(tmp / name)
                files[name] = {"bytes": (tmp / name).stat().st_size, "xxh3": _digest(tmp / name)}
            meta = {
                "format": FORMAT,
                "policy": type(policy).__name__,
                "progress": progress.to_json(),
                "files": files,
            }
            (tmp / META_FILE).write_text(json.dumps(meta, indent=1))
            _fsync(tmp / META_FILE)
            if final.exists():  # re-saving an epoch: move the old one aside first
                stale = self.directory / f".old-{final.name}-{os.getpid()}"
                final.rename(stale)
                shutil.rmtree(stale, ignore_errors=True)
            tmp.rename(final)
        except BaseException as exc:
            # Decided before the partial files are removed: torch.save to a path loses ENOSPC's
            # errno, but the file system is still (almost) full while they exist.
            fault = as_disk_fault(exc, what="checkpoint", path=final)
            full = out_of_space(self.directory) if fault is None and isinstance(exc, Exception) else None
            if full is not None:
                fault = DiskFault("checkpoint", final, full)
            shutil.rmtree(tmp, ignore_errors=True)
            if fault is None:
                raise
            raise fault from exc

    def _prune(self) -> None:
        """Keep the ``keep`` newest checkpoints that verify; move corrupt ones aside, delete the rest."""
        valid = 0
        for path in self._candidates():
            if valid < self.keep:
                try:
                    self._verify(path)
                except CheckpointError as exc:
                    self._move_aside(path, exc)
                    continue
                valid += 1
            else:
                shutil.rmtree(path, ignore_errors=True)
                self._verified.discard(path)

    def _verify(self, path: Path) -> None:
        """``read`` unless this store wrote or verified ``path`` already (then it is trusted)."""
        if path not in self._verified:
            self.read(path)
            self._verified.add(path)

    def _remember_valid(self, path: Path) -> None:
        self._verified.add(path)

    def _move_aside(self, path: Path, exc: CheckpointError) -> Path | None:
        """Rename a corrupt checkpoint to ``ckpt-<epoch>.corrupt`` (``.corrupt-2``... if taken)."""
        target = path.with_name(path.name + CORRUPT_SUFFIX)
        n = 2
        while target.exists():
            target = path.with_name(f"{path.name}{CORRUPT_SUFFIX}-{n}")
            n += 1
        try:
            path.rename(target)
        except OSError as rename_error:
            logger.warning("corrupt checkpoint %s (%s) could not be moved aside: %s", path, exc, rename_error)
            return None
        self._verified.discard(path)
        self.moved_aside.append((path, target))
        logger.warning("corrupt checkpoint moved aside to %s: %s", target, exc)
        return target

    def _candidates(self) -> list[Path]:
        """Checkpoint directories, newest first."""
        if not self.directory.is_dir():
            return []
        found = [(int(m.group(1)), p) for p in self.directory.iterdir() if (m := _NAME.match(p.name))]
        return [p for _, p in sorted(found, reverse=True)]

    # ------------------------------------------------------------------ reading
    def read(self, path: Path) -> Checkpoint:
        """The checkpoint at ``path`` after checking every file against its digest."""
        try:
            meta = json.loads((path / META_FILE).read_text())
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"{path}: unreadable {META_FILE} ({exc})") from None
        if meta.get("format") != FORMAT:
            raise CheckpointError(f"{path}: format {meta.get('format')!r}, expected {FORMAT}")
        for name, expected in meta.get("files", {}).items():
            file = path / name
            if (
                not file.is_file()
                or file.stat().st_size != expected["bytes"]
                or _digest(file) != expected["xxh3"]
            ):
                raise CheckpointError(f"{path}: {name} is missing or does not match its digest")
        return Checkpoint(path=path, progress=TrainerProgress.from_json(meta["progress"]))

    def latest(self) -> Checkpoint | None:
        """The newest checkpoint that verifies; corrupt newer ones are moved aside with a warning."""
        for path in self._candidates():
            try:
                checkpoint = self.read(path)
            except CheckpointError as exc:
                self._move_aside(path, exc)
                continue
            self._remember_valid(path)
            return checkpoint
        return None

    def load(
        self, checkpoint: Checkpoint, policy: BasePolicy, *, restore_rng_state: bool = True
    ) -> TrainerProgress:
        """Load weights, optimizer/scheduler states and (by default) RNG states into ``policy``."""
        if policy.saves_custom_checkpoints() and (checkpoint.path / MODELS_FILE).is_file():
            policy.load_models(checkpoint.path / MODELS_FILE)
        else:
            policy.load_checkpoint(str(checkpoint.path / POLICY_FILE))
        state = torch.load(checkpoint.path / TRAINER_FILE, map_location="cpu", weights_only=True)
        optimizers = policy.optimizers()
        saved = state.get("optimizers", {})
        missing = sorted(set(saved) ^ set(optimizers))
        if missing:
            raise CheckpointError(
                f"{checkpoint.path}: optimizer attributes differ from the policy's ({', '.join(missing)})"
            )
        for name, optimizer in optimizers.items():
            optimizer.load_state_dict(saved[name])
        if restore_rng_state:
            restore_rng(state["rng"])
        return checkpoint.progress

    # ------------------------------------------------------------------ completion marker
    @property
    def complete_marker(self) -> Path:
        return self.directory / COMPLETE_FILE

    def mark_complete(self, summary: dict[str, Any]) -> None:
        tmp = self.directory / f".tmp-{COMPLETE_FILE}-{os.getpid()}"
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(summary, indent=1))
            tmp.replace(self.complete_marker)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            fault = as_disk_fault(exc, what="completion marker", path=self.complete_marker)
            if fault is None:
                raise
            raise fault from None

    def completion(self) -> dict[str, Any] | None:
        """The summary recorded when the job finished, or None while it has not."""
        try:
            return json.loads(self.complete_marker.read_text())
        except FileNotFoundError:
            return None
        except ValueError:
            logger.warning("%s is unreadable; treating the job as not finished", self.complete_marker)
            return None
