"""What ``rlkube run`` does around a run, whichever way it runs: the run directory and the result lines.

I/O: prints; reads the clock for a fresh run directory's name. Shared by ``launch.run`` (the
command, and the in-process run) and ``launch.cluster_run`` (the local cluster), so neither
imports the other.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from rlkube.engine.report import RunSummary
from rlkube.engine.run_paths import RunPaths
from rlkube.failure import Failure


def fresh_run_dir(job_name: str) -> RunPaths:
    """``runs/<job>-<timestamp>``, suffixed ``-2``, ``-3``... if a run already started in that second.

    (A run directory holding a finished job would otherwise make the new run stop at once: resuming
    is for ``--run-dir``.)
    """
    base = RunPaths.default(job_name, now=datetime.now())
    candidate, n = base, 2
    while candidate.run_dir.exists():
        candidate = RunPaths(base.run_dir.with_name(f"{base.run_dir.name}-{n}"))
        n += 1
    return candidate


def summary_from_json(data: Mapping[str, Any], *, already_complete: bool = False) -> RunSummary:
    """The :class:`RunSummary` in a ``summary.json`` or ``COMPLETE.json`` (unknown keys are details)."""
    fields = {name: data[name] for name in RunSummary.__dataclass_fields__ if name in data}
    if already_complete:
        fields["already_complete"] = True
    return RunSummary(**fields)


def print_result(summary: RunSummary, paths: RunPaths, extra_summary: Path | None) -> None:
    final = "-" if summary.final_return is None else f"{summary.final_return:.1f}"
    lines = [
        f"{summary.job}: {summary.stop_reason}; mean return {final} over the last 20 episodes after "
        f"{summary.env_steps:,} env steps, {summary.epochs} epochs, {summary.wall_seconds:.1f} s "
        f"(weights v{summary.weight_version})",
    ]
    if summary.already_complete:
        lines.append(f"  already complete: {paths.checkpoints / 'COMPLETE.json'} exists, nothing was trained")
    if summary.env_steps_to_target is not None:
        lines.append(
            f"  reached the target {summary.target_return:g} at {summary.env_steps_to_target:,} env steps"
        )
    if summary.eval_return is not None:
        lines.append(f"  evaluation (greedy): mean return {summary.eval_return:.1f}")
    checkpoint = summary.paths.get("checkpoint", str(paths.checkpoints))
    lines += [
        f"  logs        {paths.tensorboard}   (tensorboard --logdir {paths.tensorboard})",
        f"  checkpoint  {checkpoint}",
        f"  plot        {paths.plot}",
        f"  summary     {paths.summary}" + (f" and {extra_summary}" if extra_summary else ""),
    ]
    print("\n".join(lines), flush=True)


def write_failure_summary(
    paths: RunPaths, failure: Failure | None, message: str, extra_summary: Path | None = None
) -> None:
    """``summary.json`` of a failed run: ``stop_reason: failed`` and the failure (exception, frame)."""
    data = {
        "run_dir": str(paths.run_dir),
        "stop_reason": "failed",
        "failure": failure.to_json() if failure is not None else None,
        "message": failure.message if failure is not None else message.splitlines()[0] if message else "",
    }
    text = json.dumps(data, indent=2) + "\n"
    paths.summary.parent.mkdir(parents=True, exist_ok=True)
    paths.summary.write_text(text)
    if extra_summary is not None:
        extra_summary.parent.mkdir(parents=True, exist_ok=True)
        extra_summary.write_text(text)
