"""``rlkube run JOB.yaml``: validate the job, find its policy, run it, say where the results are.

I/O: reads the job, writes the run directory, prints. Exit codes: 0 done (or already complete),
2 the job is invalid (bad field, unknown policy or env, a module that does not import; nothing
has started), 1 the run failed, 130 interrupted.

Everything that can be refused is checked before the run directory is created. By default the
job runs as a local cluster (``rlkube.launch.cluster_run``: train ranks and eval workers as
processes with the pod env contract); ``--in-process`` runs both roles in this process
(``rlkube.launch.in_process``: the cluster's own engine and eval worker), the quickest way to
debug a policy.
"""

from __future__ import annotations

import argparse
import logging
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

from rlkube.engine.loggers import run_observers
from rlkube.engine.report import RunObserver
from rlkube.engine.run_paths import RunPaths
from rlkube.failure import describe_exception, format_console
from rlkube.jobfile import dump_job, load_job
from rlkube.launch import preflight as preflight_checks
from rlkube.launch.cluster_run import run_local_cluster
from rlkube.launch.in_process import InProcessRun
from rlkube.launch.preflight import preflight
from rlkube.launch.preflight import resolve_policy as resolve_policy  # re-exported: its old home
from rlkube.launch.progress import LiveProgress, PlainProgress
from rlkube.launch.results import fresh_run_dir, print_result, write_failure_summary
from rlkube.placement import TrainPlacement
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
    # Every train rank of a local run shares this machine's GPUs (--in-process runs one learner).
    placement = (
        None if args.in_process else TrainPlacement.local(job.spec, gpus=preflight_checks.local_gpus())
    )
    checks = preflight(job, check_checkpoint=True, placement=placement)
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
    if args.nodes < 1:
        print(f"rlkube: --nodes must be at least 1, got {args.nodes}", file=sys.stderr)
        return EXIT_INVALID
    return run_local_cluster(job, args)


def run_in_process(job: RLJob, policy_cls: type[BasePolicy], args: argparse.Namespace) -> int:
    paths = RunPaths(Path(args.run_dir)) if args.run_dir else fresh_run_dir(job.name)
    try:
        engine = InProcessRun(job, policy_cls, paths=paths)
    except SpecError as exc:
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
        failure = describe_exception(exc)
        print(f"rlkube: the run failed: {format_console(failure)}", file=sys.stderr)
        write_failure_summary(paths, failure, str(exc), args.summary)
        return EXIT_FAILED
    print_result(summary, paths, args.summary)
    return EXIT_OK


def _observers(job: RLJob, paths: RunPaths, args: argparse.Namespace) -> list[RunObserver]:
    observers = run_observers(job, paths, extra_summary=args.summary)
    from rich.console import Console

    console = Console(stderr=False)
    if args.no_progress or not console.is_terminal:
        observers.append(PlainProgress(interval=job.spec.log.interval_seconds))
    else:
        observers.append(LiveProgress(console))
    return observers


def _configure_logging(level: str) -> None:
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(level=level.upper(), format="%(levelname)s %(name)s: %(message)s")
    else:
        root.setLevel(level.upper())
