"""``rlkube run JOB.yaml``: validate the job, find its policy, run it, say where the results are.

I/O: reads the job, writes the run directory, prints. Exit codes: 0 done (or already complete),
2 the job is invalid (bad field, unknown policy or env, a module that does not import; nothing
has started), 1 the run failed, 130 interrupted.

Everything that can be refused is checked before the run directory is created. By default the
job runs as a local cluster (``rlkube.launch.cluster_run``: train ranks and eval workers as
processes with the pod env contract); ``--in-process`` runs both roles in this process
(``InProcessEngine``), which is the quickest way to debug a policy.
"""

from __future__ import annotations

import argparse
import logging
import sys
import traceback
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from rlkube.engine.in_process import EngineError, InProcessEngine
from rlkube.engine.report import LearningCurve, RunObserver, RunSummary, SummaryFiles, TensorBoardLog
from rlkube.engine.run_paths import RunPaths
from rlkube.jobfile import dump_job, load_job
from rlkube.launch.preflight import preflight
from rlkube.launch.preflight import resolve_policy as resolve_policy  # re-exported: its old home
from rlkube.launch.progress import LiveProgress, PlainProgress
from rlkube.policy.base import BasePolicy
from rlkube.spec import RLJob, SpecError

logger = logging.getLogger("rlkube")

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_INVALID = 2


def main(args: argparse.Namespace) -> int:
    try:
        job = load_job(args.job, args.overrides)
    except SpecError as exc:
        print(f"rlkube: {exc}", file=sys.stderr)
        return EXIT_INVALID
    _configure_logging(job.spec.log.level.value)
    checks = preflight(job, check_checkpoint=True)
    if checks.refusal is not None:
        problems = "\n".join(f"  - {p}" for p in checks.refusal.problems)
        print(f"rlkube: invalid job {args.job}:\n{problems}", file=sys.stderr)
        return EXIT_INVALID
    policy_cls = checks.policy_cls
    assert policy_cls is not None
    return _runner(args)(job, policy_cls, args)


def _runner(args: argparse.Namespace) -> Callable[[RLJob, type[BasePolicy], argparse.Namespace], int]:
    """How the job runs: a local cluster of processes (default), or one process (``--in-process``)."""
    return run_in_process if args.in_process else run_local


def run_local(job: RLJob, policy_cls: type[BasePolicy], args: argparse.Namespace) -> int:
    from rlkube.launch.cluster_run import run_local_cluster

    if args.nodes < 1:
        print(f"rlkube: --nodes must be at least 1, got {args.nodes}", file=sys.stderr)
        return EXIT_INVALID
    return run_local_cluster(job, args)


def run_in_process(job: RLJob, policy_cls: type[BasePolicy], args: argparse.Namespace) -> int:
    paths = RunPaths(Path(args.run_dir)) if args.run_dir else _fresh_run_dir(job.name)
    try:
        engine = InProcessEngine(job, policy_cls, paths=paths)
    except (SpecError, EngineError) as exc:
        print(f"rlkube: invalid job {args.job}:\n  - {exc}", file=sys.stderr)
        return EXIT_INVALID
    paths.create()
    paths.job.write_text(dump_job(job))
    engine.observers = _observers(job, paths, args)
    try:
        summary = engine.run()
    except KeyboardInterrupt:
        print(f"\nrlkube: interrupted; checkpoints so far are in {paths.checkpoints}", file=sys.stderr)
        return 130
    except Exception as exc:
        traceback.print_exc()
        print(f"rlkube: the run failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    _print_result(summary, paths, args.summary)
    return EXIT_OK


def _fresh_run_dir(job_name: str) -> RunPaths:
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


def _observers(job: RLJob, paths: RunPaths, args: argparse.Namespace) -> list[RunObserver]:
    observers: list[RunObserver] = []
    if job.spec.log.tensorboard:
        observers.append(TensorBoardLog(paths.tensorboard))
    observers += [LearningCurve(paths.plot), SummaryFiles(paths.summary, args.summary)]
    from rich.console import Console

    console = Console(stderr=False)
    if args.no_progress or not console.is_terminal:
        observers.append(PlainProgress(interval=job.spec.log.interval_seconds))
    else:
        observers.append(LiveProgress(console))
    return observers


def _print_result(summary: RunSummary, paths: RunPaths, extra_summary: Path | None) -> None:
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


def _configure_logging(level: str) -> None:
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(level=level.upper(), format="%(levelname)s %(name)s: %(message)s")
    else:
        root.setLevel(level.upper())
