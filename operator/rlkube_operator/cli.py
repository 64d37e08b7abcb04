"""Entry points of ``rlkube render``, ``rlkube crd`` and ``rlkube operator`` (called by rlkube.cli)."""

from __future__ import annotations

import argparse
import logging
import sys

import yaml


class _BlockDumper(yaml.SafeDumper):
    """Multi-line strings (the ConfigMap's job.yaml) as literal blocks, for people to read."""


def _represent_str(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    style = "|" if "\n" in text else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_BlockDumper.add_representer(str, _represent_str)


def render_command(args: argparse.Namespace) -> int:
    """Print the objects the operator would create for a job file (operator defaults from the env)."""
    from rlkube.jobfile import load_job

    from rlkube_operator.render import render
    from rlkube_operator.settings import SettingsError, load_settings

    job = load_job(args.job, args.overrides)
    try:
        settings = load_settings()
    except SettingsError as exc:
        print(f"rlkube render: {exc}", file=sys.stderr)
        return 2
    print(yaml.dump_all(render(job, settings.render), Dumper=_BlockDumper, sort_keys=False), end="")
    return 0


def crd_command(args: argparse.Namespace) -> int:
    """Print the RLJob CustomResourceDefinition."""
    from rlkube_operator.crd import build_crd

    print(yaml.safe_dump(build_crd(), sort_keys=False, width=100), end="")
    return 0


def _operator_parser() -> argparse.ArgumentParser:
    from rlkube_operator.settings import ENV_VARS

    epilog = "settings (environment):\n" + "\n".join(f"  {name:30} {text}" for name, text in ENV_VARS.items())
    parser = argparse.ArgumentParser(
        prog="rlkube operator",
        description="Run the RLJob operator (kopf) against the cluster of the current kubeconfig "
        "or the in-cluster service account.",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "-n",
        "--namespace",
        action="append",
        default=[],
        help="serve this namespace (repeatable; globs allowed); default RLKUBE_WATCH_NAMESPACES or all",
    )
    parser.add_argument("-A", "--all-namespaces", action="store_true", help="serve the whole cluster")
    parser.add_argument("--verbose", action="store_true", help="log at debug level")
    return parser


def parse_operator_args(argv: list[str]) -> argparse.Namespace:
    """The options of ``rlkube operator`` (what the Helm chart's Deployment passes); exits on bad ones."""
    return _operator_parser().parse_args(argv)


def operator_command(args: argparse.Namespace) -> int:
    """``rlkube operator [-n NS]... [-A] [--verbose]``: check the settings, then run kopf until stopped."""
    import os

    from rlkube_operator.settings import SettingsError, load_settings, unknown_variables

    options = parse_operator_args(list(getattr(args, "kopf_args", []) or []))
    try:
        settings = load_settings()
    except SettingsError as exc:
        print(f"rlkube operator: {exc}", file=sys.stderr)
        return 2
    for name in unknown_variables(os.environ):
        print(
            f"rlkube operator: ignoring {name}: not an operator setting (rlkube operator --help)",
            file=sys.stderr,
        )

    import kopf

    level = logging.DEBUG if options.verbose else getattr(logging, settings.log_level.upper())
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not options.verbose:
        # kopf logs every handler and timer run at INFO; our events already say what happened.
        logging.getLogger("kopf.objects").setLevel(max(level, logging.WARNING))
    # Importing the module registers the handlers with kopf's default registry.
    import rlkube_operator.handlers  # noqa: F401

    namespaces = list(options.namespace) or list(settings.namespaces)
    clusterwide = options.all_namespaces or not namespaces
    kopf.run(standalone=True, clusterwide=clusterwide, namespaces=[] if clusterwide else namespaces)
    return 0
