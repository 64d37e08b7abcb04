"""Operator figures on this machine: apply-to-children latency, 100 RLJobs, operator memory.

    python -m tests.operator.measure [--jobs 100] [--samples 10] [--json out.json]

Times come from kubectl watches of every kind involved (the moment each event reached the
watch), so polling does not blur them. The operator runs as in production (one process, kopf,
real HTTP) against a real kube-apiserver started on this machine (no nodes: the pods stay
Pending), so the figures measure the operator plus the API server.
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
from rlkube_devcluster.controlplane.cluster import ControlPlane
from rlkube_devcluster.coordinators import FakeCoordinators
from rlkube_devcluster.operator_process import OperatorProcess
from rlkube_devcluster.waiting import wait_for

from tests.operator.harness import ROOT, Watch, kubectl
from tests.operator.manifests import job_document

CHILD_KINDS = ("configmaps", "services", "statefulsets")
CHILDREN_PER_JOB = 6  # ConfigMap, 3 Services, 2 StatefulSets


class Clock:
    """When every object was first seen, and every RLJob's first status, from kubectl's watches."""

    def __init__(self, kubeconfig: Path) -> None:
        self.watches = {kind: Watch(kubeconfig, None, kind) for kind in ("rlj", *CHILD_KINDS)}

    def stop(self) -> None:
        for watch in self.watches.values():
            watch.stop()

    def added(self, kind: str, namespace: str, name: str) -> float | None:
        return next(
            (
                e.at
                for e in list(self.watches[kind].seen)
                if e.obj["metadata"].get("namespace") == namespace and e.obj["metadata"]["name"] == name
            ),
            None,
        )

    def first_status(self, namespace: str, job: str) -> float | None:
        return next(
            (
                e.at
                for e in list(self.watches["rlj"].seen)
                if e.obj["metadata"]["namespace"] == namespace
                and e.obj["metadata"]["name"] == job
                and e.obj.get("status", {}).get("phase")
            ),
            None,
        )

    def children_done(self, namespace: str, job: str) -> float | None:
        times = [
            e.at
            for kind in CHILD_KINDS
            for e in list(self.watches[kind].seen)
            if e.type == "ADDED"
            and e.obj["metadata"].get("namespace") == namespace
            and e.obj["metadata"]["name"].startswith(f"{job}-")
        ]
        return max(times) if len(times) >= CHILDREN_PER_JOB else None


def measure(jobs: int, samples: int, workdir: Path) -> dict[str, Any]:
    sockets = Path(tempfile.mkdtemp(prefix="rlk"))
    plane = ControlPlane(workdir / "k8s").start()
    kubectl(plane.kubeconfig, "apply", "-f", str(ROOT / "crds"))
    kubectl(plane.kubeconfig, "wait", "--for=condition=Established", "crd/rljobs.rlkube.io", "--timeout=120s")
    clock = Clock(plane.kubeconfig)
    coordinators = FakeCoordinators(sockets)
    operator = OperatorProcess(
        plane.kubeconfig,
        socket_dir=sockets,
        log=workdir / "operator.log",
        env={"RLKUBE_STATUS_INTERVAL": "5", "RLKUBE_COORDINATOR_TIMEOUT": "1"},
    )
    try:
        operator.start()
        idle_rss = operator.rss_bytes()
        # 1. apply -> children, one job at a time.
        kubectl(plane.kubeconfig, "create", "namespace", "latency")
        latencies = []
        for index in range(samples):
            name = f"lat{index}"
            kubectl(
                plane.kubeconfig,
                "-n",
                "latency",
                "apply",
                "-f",
                "-",
                input=yaml.safe_dump(job_document(name)),
            )
            done = wait_for(lambda n=name: clock.children_done("latency", n), timeout=120)
            added = wait_for(lambda n=name: clock.added("rlj", "latency", n), timeout=120)
            latencies.append(done - added)
        # 2. many jobs at once, in one kubectl apply.
        kubectl(plane.kubeconfig, "create", "namespace", "bulk")
        names = [f"job{i:03d}" for i in range(jobs)]
        for name in names:
            coordinators.report("bulk", name, phase="Running", epoch=1, max_epochs=10, weight_version=1)
        manifest = yaml.safe_dump_all([job_document(name) for name in names])
        kubectl(
            plane.kubeconfig,
            "-n",
            "bulk",
            "apply",
            "-f",
            "-",
            input=manifest,
            timeout=600,
        )
        stored = wait_for(
            lambda: (t := [clock.added("rlj", "bulk", n) for n in names]) and all(t) and t, timeout=600
        )
        first, last_stored = min(stored), max(stored)
        children_done = wait_for(
            lambda: (
                all(clock.children_done("bulk", n) for n in names)
                and max(clock.children_done("bulk", n) for n in names)
            ),
            timeout=600,
            interval=0.2,
        )
        status_done = wait_for(
            lambda: (t := [clock.first_status("bulk", n) for n in names]) and all(t) and max(t),
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
        clock.stop()
        coordinators.stop()
        plane.stop()
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
