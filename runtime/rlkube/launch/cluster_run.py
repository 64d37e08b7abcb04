"""``rlkube run`` as a local cluster: start the processes, show progress, report, clean up.

I/O. Builds the :class:`~rlkube.launch.local.Layout` (run directory, one shm directory per
simulated node under ``/dev/shm``, free ports), writes the resolved job where every "pod" reads
it, and supervises the processes while a status line shows what the coordinator reports
(``GetStatus``: epoch, steps/s, return, weight version, eval workers, per-node weight lag).
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.text import Text

from rlkube import contract
from rlkube._proto import policy_group_pb2 as pb
from rlkube.coordinator.client import CoordinatorError, PolicyGroupClient
from rlkube.engine.checkpoint import CheckpointStore
from rlkube.engine.disk import DiskFault, check_writable, describe, is_disk_error
from rlkube.engine.run_paths import RunPaths
from rlkube.failure import format_console
from rlkube.jobfile import dump_job
from rlkube.launch.local import CLUSTER_FILE, Layout, Outcome, Ports, Supervisor, supervise
from rlkube.launch.netns import NetnsError, NodeNet, discover_all
from rlkube.launch.results import fresh_run_dir, print_result, summary_from_json, write_failure_summary
from rlkube.security.credential import Credential, new_token, write_token_file
from rlkube.spec import RLJob

SHM_ROOT = Path("/dev/shm")


def describe_status(status: pb.JobStatus) -> str:
    """One line of what the coordinator reports (pure)."""
    ret = f"{status.last_return:.1f}" if status.HasField("last_return") else "-"
    lag = ", ".join(
        f"{n.node_name} v{n.version}" + (f" (lag {n.lag})" if n.lag else "") for n in status.nodes
    )
    text = (
        f"epoch {status.epoch}/{status.max_epochs} | env steps {status.env_steps:,} | "
        f"{status.steps_per_second:,.0f} steps/s | return(20) {ret} | weights v{status.weight_version} | "
        f"eval workers {status.eval_workers}"
    )
    if lag:
        text += f" | nodes: {lag}"
    if status.fragments_refused or status.fragments_quarantined:
        text += f" | refused {status.fragments_refused}, quarantined {status.fragments_quarantined}"
        if status.refusals:
            newest = status.refusals[-1]
            text += f" (newest: {newest.worker} {newest.task}: {newest.reason[:120]})"
        if status.workers_evicted:
            text += f", {status.workers_evicted} evicted"
    if status.message:
        text += f" | {status.message}"
    return text


def print_refusals(data: dict[str, Any], paths: RunPaths) -> None:
    """The summary's refused and quarantined fragments, each with its worker, and the evicted pods."""
    refused, quarantined = data.get("fragments_refused", 0), data.get("fragments_quarantined", 0)
    if not refused and not quarantined:
        return
    print(
        f"  refused     {refused} fragments refused at the edge, {quarantined} quarantined"
        + (f" (in {paths.quarantine})" if quarantined else "")
    )
    for record in data.get("refusals", []):
        how = "quarantined" if record.get("quarantined") else "refused"
        evicted = "; its pod was evicted" if record.get("evicted") else ""
        print(f"              {how}: {record['worker']} task {record['task']}: {record['reason']}{evicted}")
    for pod in data.get("workers_evicted", []):
        print(f"  evicted     eval pod {pod} (its fragments were refused repeatedly)")


class StatusLine:
    """Polls GetStatus on every supervisor tick and shows it (live line, or a line per interval)."""

    def __init__(self, address: str, *, live: bool, interval: float, credential: Credential) -> None:
        self.client = PolicyGroupClient(address, credential=credential)
        self.interval = interval
        self.console = Console()
        self.live = Live(Text("starting..."), console=self.console, refresh_per_second=4) if live else None
        self._last_print = 0.0
        self._last_text = ""

    def __enter__(self) -> StatusLine:
        if self.live is not None:
            self.live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.stop()
        self.client.close()

    def tick(self, supervisor: Supervisor) -> None:
        try:
            text = describe_status(self.client.status(timeout=1.0))
        except CoordinatorError:
            text = "waiting for the coordinator..."
        restarts = supervisor.train_restarts + supervisor.eval_restarts
        if restarts:
            text += f" | restarts: train {supervisor.train_restarts}, eval {supervisor.eval_restarts}"
        if self.live is not None:
            self.live.update(Text(text))
        elif text != self._last_text and time.monotonic() - self._last_print >= self.interval:
            print(text, flush=True)
            self._last_print, self._last_text = time.monotonic(), text


def run_local_cluster(job: RLJob, args: argparse.Namespace) -> int:
    paths = RunPaths(Path(args.run_dir)) if args.run_dir else fresh_run_dir(job.name)
    done = CheckpointStore(paths.checkpoints).completion()
    if done is not None:
        print_result(summary_from_json(done, already_complete=True), paths, args.summary)
        return 0
    try:
        check_writable(paths.run_dir, what="run directory")
        check_writable(paths.checkpoints, what="checkpoint directory")
        paths.create()
        paths.job.write_text(dump_job(job))
    except (DiskFault, OSError) as exc:
        if not is_disk_error(exc):
            raise
        print(f"rlkube: {describe(exc)}", file=sys.stderr)
        return 1
    nodes = max(1, int(args.nodes))
    netns: tuple[NodeNet, ...] = ()
    if getattr(args, "netns", None):
        try:
            netns = discover_all(args.netns)
        except NetnsError as exc:
            print(f"rlkube: {exc}", file=sys.stderr)
            return 2
        if args.nodes not in (1, len(netns)):
            print(f"rlkube: --nodes {args.nodes} but --netns names {len(netns)} namespaces", file=sys.stderr)
            return 2
        nodes = len(netns)
    layout = Layout(
        job=job,
        run_dir=paths.run_dir.resolve(),
        shm_root=SHM_ROOT / f"rlkube-{job.name}-{secrets.token_hex(4)}",
        nodes=nodes,
        ports=Ports.allocate(job.spec.trainer.replicas),
        listen_host=getattr(args, "listen", None) or contract.LISTEN_LOOPBACK,
        netns=netns,
        standby=bool(getattr(args, "standby", False)),
    )
    write_token_file(layout.token_file, new_token())  # a fresh credential for every run
    supervisor = Supervisor(layout)
    where = f" in network namespaces {', '.join(n.namespace for n in netns)}" if netns else ""
    print(
        f"{job.name}: {job.spec.trainer.replicas} train ranks, {job.spec.evaluator.replicas} eval workers on "
        f"{nodes} simulated node(s){where}, strategy {job.spec.policy.weight_buffer.strategy.value}; "
        f"run directory {paths.run_dir}\n  scale with: rlkube scale {paths.run_dir} --evaluators K"
        f"\n  metrics: each process serves /metrics on its own port, see {paths.run_dir / CLUSTER_FILE}",
        flush=True,
    )
    live = not args.no_progress and Console().is_terminal
    with StatusLine(
        layout.coordinator_addr,
        live=live,
        interval=job.spec.log.interval_seconds,
        credential=Credential.from_file(layout.token_file),
    ) as view:
        outcome = supervise(supervisor, on_tick=view.tick)
    return report(outcome, paths, args.summary)


def report(outcome: Outcome, paths: RunPaths, extra_summary: Path | None) -> int:
    if outcome.code != 0:
        print(f"rlkube: {outcome.message}", file=sys.stderr)
        if outcome.failure is not None:
            print(f"rlkube: the run failed: {format_console(outcome.failure)}", file=sys.stderr)
        if outcome.code != 130:
            write_failure_summary(paths, outcome.failure, outcome.message, extra_summary)
        return outcome.code
    try:
        data = json.loads(paths.summary.read_text())
    except (OSError, ValueError):  # rank 0 could not write it (a full disk): the marker holds the same
        data = CheckpointStore(paths.checkpoints).completion() or {}
        print(f"rlkube: {paths.summary} was not written; the figures below are from the completion marker")
    if extra_summary is not None:
        extra_summary.parent.mkdir(parents=True, exist_ok=True)
        extra_summary.write_text(json.dumps(data, indent=2) + "\n")
    print_result(summary_from_json(data), paths, extra_summary)
    for moved in data.get("corrupt_checkpoints", []):
        print(f"  corrupt     a checkpoint that did not verify was moved aside: {moved}")
    if "fingerprint_checks" in data:
        verdict = "consistent" if data.get("fingerprints_consistent") else "INCONSISTENT"
        print(f"  weights     train/eval fingerprints {verdict} over {data['fingerprint_checks']} versions")
    print_refusals(data, paths)
    if "weight_wait_fraction" in data:
        line = (
            f"  rollouts    {data.get('fragments_acknowledged', 0)} fragments; eval workers waited"
            f" for weights {100 * data['weight_wait_fraction']:.1f}% of their rollout time"
        )
        if data.get("dropped_stale"):
            line += f"; {data['dropped_stale']} fragments dropped as stale"
        if data.get("corrected_stale"):
            line += f"; {data['corrected_stale']} stale fragments corrected with V-trace"
        if "fragments_used_share" in data:
            line += f"; {100 * data['fragments_used_share']:.0f}% of fragments used"
        print(line)
    return 0
