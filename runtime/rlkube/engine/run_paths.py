"""Where a run's outputs go. Pure: computes paths; ``create()`` is the only I/O.

::

    <run_dir>/
      job.yaml              the resolved job (after --set overrides)
      checkpoints/          ckpt-<epoch>/ and COMPLETE.json (see rlkube.engine.checkpoint)
      tensorboard/          event files (tensorboard --logdir <run_dir>/tensorboard)
      quarantine/           fragments set aside untrained, each with a .json note (rlkube.coordinator.journal)
      learning_curve.png
      summary.json
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path


@dataclass(frozen=True)
class RunPaths:
    run_dir: Path

    @classmethod
    def default(cls, job_name: str, *, now: datetime, root: str | os.PathLike[str] = "runs") -> RunPaths:
        """``runs/<job-name>-<YYYYmmdd-HHMMSS>``."""
        return cls(Path(root) / f"{job_name}-{now.strftime('%Y%m%d-%H%M%S')}")

    @property
    def job(self) -> Path:
        return self.run_dir / "job.yaml"

    @property
    def checkpoints(self) -> Path:
        return self.run_dir / "checkpoints"

    @property
    def quarantine(self) -> Path:
        return self.run_dir / "quarantine"

    @property
    def tensorboard(self) -> Path:
        return self.run_dir / "tensorboard"

    @property
    def plot(self) -> Path:
        return self.run_dir / "learning_curve.png"

    @property
    def summary(self) -> Path:
        return self.run_dir / "summary.json"

    def create(self) -> RunPaths:
        self.checkpoints.mkdir(parents=True, exist_ok=True)
        self.tensorboard.mkdir(parents=True, exist_ok=True)
        return self

    def as_dict(self) -> dict[str, str]:
        return {
            "run_dir": str(self.run_dir),
            "checkpoints": str(self.checkpoints),
            "tensorboard": str(self.tensorboard),
            "plot": str(self.plot),
            "summary": str(self.summary),
        }
