"""Operator figures on this machine: apply-to-children latency, 100 RLJobs, operator memory.

    python -m tests.operator.measure [--jobs 100] [--samples 10] [--json out.json]

Times come from the emulator's own write log (the moment each object was stored), so polling
does not blur them. The operator runs as in production (one process, kopf, real HTTP); the API
server is the in-process emulator, so the figures measure the operator plus a fast API server.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from rlkube_devcluster.coordinators import FakeCoordinators
from rlkube_devcluster.emulator.cluster import EmulatedCluster
from rlkube_devcluster.emulator.store import WatchEvent
from rlkube_devcluster.operator_process import OperatorProcess
from rlkube_devcluster.waiting import wait_for

from tests.operator.harness import ROOT, kubectl
from tests.operator.manifests import job_document

CHILD_KINDS = ("ConfigMap", "Service", "StatefulSet")
CHILDREN_PER_JOB = 6  # ConfigMap, 3 Services, 2 StatefulSets


class Clock:
    """Monotonic time of every object's first storage, and of every RLJob status write."""

    def __init__(self) -> None:
        self.added: dict[tuple[str, str, str], float] = {}
        self.first_status: dict[tuple[str, str], float] = {}

    def __call__(self, rtype: Any, event: WatchEvent) -> None:
        meta = event.obj["metadata"]
        key = (rtype.kind, meta.get("namespace", ""), meta["name"])
        if event.type == "ADDED":
            self.added.setdefault(key, time.monotonic())
        if rtype.kind == "RLJob" and event.obj.get("status", {}).get("phase"):
            self.first_status.setdefault((meta["namespace"], meta["name"]), time.monotonic())

    def children_done(self, namespace: str, job: str) -> float | None:
        times = [
            t
            for (kind, ns, name), t in self.added.items()
            if ns == namespace and kind in CHILD_KINDS and name.startswith(f"{job}-")
        ]
        return max(times) if len(times) >= CHILDREN_PER_JOB else None


def measure(jobs: int, samples: int, workdir: Path) -> dict[str, Any]:
    sockets = Path(tempfile.mkdtemp(prefix="rlk"))
    cluster = EmulatedCluster(workdir, crds=[ROOT / "crds" / "rljob.yaml"]).start()
    clock = Clock()
    cluster.call(cluster.emulator.store.listeners.append, clock)  # type: ignore[union-attr]
    coordinators = FakeCoordinators(sockets)
    operator = OperatorProcess(
        cluster.operator_kubeconfig,
        socket_dir=sockets,
        log=workdir / "operator.log",
        env={"RLKUBE_STATUS_INTERVAL": "5", "RLKUBE_COORDINATOR_TIMEOUT": "1"},
    )
    try:
        operator.start()
        idle_rss = operator.rss_bytes()
        # 1. apply -> children, one job at a time.
        cluster.create_namespace("latency")
        latencies = []
        for index in range(samples):
            name = f"lat{index}"
            kubectl(cluster.kubeconfig, "-n", "latency", "apply", "--validate=false", "-f", "-",
                    input=yaml.safe_dump(job_document(name)))  # fmt: skip
            done = wait_for(lambda n=name: clock.children_done("latency", n), timeout=120)
            latencies.append(done - clock.added[("RLJob", "latency", name)])
        # 2. many jobs at once, in one kubectl apply.
        cluster.create_namespace("bulk")
        names = [f"job{i:03d}" for i in range(jobs)]
        for name in names:
            coordinators.report("bulk", name, phase="Running", epoch=1, max_epochs=10, weight_version=1)
        manifest = yaml.safe_dump_all([job_document(name) for name in names])
        kubectl(
            cluster.kubeconfig,
            "-n",
            "bulk",
            "apply",
            "--validate=false",
            "-f",
            "-",
            input=manifest,
            timeout=600,
        )
        first = min(clock.added[("RLJob", "bulk", n)] for n in names)
        last_stored = max(clock.added[("RLJob", "bulk", n)] for n in names)
        children_done = wait_for(
            lambda: (
                all(clock.children_done("bulk", n) for n in names)
                and max(clock.children_done("bulk", n) for n in names)
            ),
            timeout=600,
            interval=0.2,
        )
        status_done = wait_for(
            lambda: (
                all(("bulk", n) in clock.first_status for n in names)
                and max(clock.first_status[("bulk", n)] for n in names)
            ),
            timeout=600,
            interval=0.2,
        )
        time.sleep(5)  # let a few status rounds run before reading memory
        busy_rss = operator.rss_bytes()
        return {
            "apply_to_children_seconds": {
                "median": round(statistics.median(latencies), 4),
                "max": round(max(latencies), 4),
                "samples": len(latencies),
            },
            "jobs": jobs,
            "kubectl_apply_stored_all_jobs_seconds": round(last_stored - first, 2),
            "all_children_of_all_jobs_seconds": round(children_done - first, 2),
            "first_status_of_all_jobs_seconds": round(status_done - first, 2),
            "operator_rss_mib": {
                "idle": round(idle_rss / 2**20, 1),
                f"with_{jobs + samples}_jobs": round(busy_rss / 2**20, 1),
            },
        }
    finally:
        operator.stop()
        coordinators.stop()
        cluster.stop()
        shutil.rmtree(sockets, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--samples", type=int, default=10)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="rlkube-measure-"))
    try:
        figures = measure(args.jobs, args.samples, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(figures, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
