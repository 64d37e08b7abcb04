"""The ``rlkube`` command. Each subcommand imports its implementation lazily, so
``rlkube validate --schema-only`` or ``rlkube crd`` start without loading torch.

    rlkube run JOB.yaml [--set spec.train.maxEpochs=3] [--nodes 2] [--summary out.json]
    rlkube validate JOB.yaml             check a job, its policy, env and buffer; name every bad field
    rlkube scale RUN_DIR --evaluators K  change the eval count of a running local job
    rlkube pod                           the entrypoint of train and eval pods (reads the env contract)
    rlkube render JOB.yaml               print the Kubernetes objects the operator would create
    rlkube crd                           print the RLJob CustomResourceDefinition
    rlkube operator [-n NS]... [-A]      run the operator (what the Helm chart starts)
    rlkube bench weights|rollout         benchmarks, side by side with peers (source checkout)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rlkube import __version__


def _job_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job", type=Path, help="RLJob manifest (YAML)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="PATH=VALUE",
        help="override a field, YAML spelling: --set spec.train.maxEpochs=3 (repeatable)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlkube", description="Reinforcement learning on Kubernetes.")
    parser.add_argument("--version", action="version", version=f"rlkube {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="run a job on this machine as local processes")
    _job_args(run)
    run.add_argument("--nodes", type=int, default=1, help="simulated nodes (one shm directory each)")
    run.add_argument("--run-dir", type=Path, default=None, help="where logs, checkpoints and plots go")
    run.add_argument("--summary", type=Path, default=None, help="also write summary.json here")
    run.add_argument(
        "--in-process",
        action="store_true",
        help="train and eval roles in one process (no gRPC, strategy None); for debugging a policy",
    )
    run.add_argument("--no-progress", action="store_true", help="plain log lines instead of a live bar")
    run.add_argument(
        "--listen",
        default=None,
        metavar="HOST",
        help="address the coordinator and weight servers bind (default 127.0.0.1: this machine only)",
    )
    run.add_argument(
        "--netns",
        default=None,
        metavar="NS0,NS1",
        help="run node i's processes in network namespace NSi (one per node; needs root): "
        "servers bind each namespace's address, node 0's is the coordinator's",
    )
    run.add_argument(
        "--standby",
        action="store_true",
        help="keep a warm standby of every train rank (imports done): a restart skips Python start-up",
    )

    validate = sub.add_parser("validate", help="check a job manifest, its policy, env and buffer")
    _job_args(validate)
    validate.add_argument(
        "--schema-only", action="store_true", help="check only the spec (no policy import, no torch)"
    )

    scale = sub.add_parser("scale", help="change the eval worker count of a running local job")
    scale.add_argument("run_dir", type=Path, help="the run directory printed by `rlkube run`")
    scale.add_argument("--evaluators", type=int, required=True, help="desired eval workers")

    journal = sub.add_parser("journal", help="what a run's acknowledgement journal holds (read only)")
    journal.add_argument("run_dir", type=Path, help="the run directory printed by `rlkube run`")

    sub.add_parser("pod", help="pod entrypoint: run this pod's role from the env contract")

    render = sub.add_parser("render", help="print the objects the operator creates for a job")
    _job_args(render)

    sub.add_parser("crd", help="print the RLJob CustomResourceDefinition (YAML)")

    # add_help=False: `rlkube operator --help` is answered by the operator's own parser.
    operator = sub.add_parser("operator", help="run the kopf operator", add_help=False)
    operator.add_argument(
        "kopf_args", nargs=argparse.REMAINDER, help="its options (`rlkube operator --help`)"
    )

    bench = sub.add_parser("bench", help="benchmarks (from a source checkout)")
    bench.add_argument("bench_args", nargs=argparse.REMAINDER, help="weights|rollout and their options")
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line as ``rlkube`` reads it; exits with a usage error on a bad one.

    ``operator`` and ``bench`` pass their arguments on (``kopf_args``, ``bench_args``) to parsers
    of their own (``rlkube_operator.cli.parse_operator_args`` for the operator).
    """
    parser = build_parser()
    # argparse's REMAINDER does not take options that come first (`rlkube operator -A`), so the
    # pass-through commands get every argument argparse did not know.
    args, extra = parser.parse_known_args(argv)
    if extra and args.command == "operator":
        args.kopf_args = [*extra, *args.kopf_args]
    elif extra and args.command == "bench":
        args.bench_args = [*args.bench_args, *extra]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return int(_dispatch(args) or 0)
    except KeyboardInterrupt:
        return 130


def _dispatch(args: argparse.Namespace) -> int | None:
    from rlkube.spec import SpecError

    try:
        if args.command == "validate":
            from rlkube.launch.validate import validate

            return validate(args)
        if args.command == "run":
            from rlkube.launch.run import main as run_main

            return run_main(args)
        if args.command == "scale":
            from rlkube.launch.control import scale

            return scale(args)
        if args.command == "journal":
            from rlkube.launch.journal_report import journal_command

            return journal_command(args)
        if args.command == "pod":
            from rlkube.launch.pod import main as pod_main

            return pod_main(args)
        if args.command == "render":
            from rlkube_operator.cli import render_command

            return render_command(args)
        if args.command == "crd":
            from rlkube_operator.cli import crd_command

            return crd_command(args)
        if args.command == "operator":
            from rlkube_operator.cli import operator_command

            return operator_command(args)
        if args.command == "bench":
            return _bench(args.bench_args)
    except SpecError as exc:
        print(f"rlkube: {exc}", file=sys.stderr)
        return 2
    raise AssertionError(f"unhandled command {args.command}")


def _bench(argv: list[str]) -> int:
    root = Path(__file__).resolve().parents[2]
    if not (root / "benchmarks" / "cli.py").is_file():
        print("rlkube bench runs from a source checkout (benchmarks/ is not installed)", file=sys.stderr)
        return 2
    sys.path.insert(0, str(root))
    from benchmarks.cli import main as bench_main

    return bench_main(argv)


if __name__ == "__main__":
    sys.exit(main())
