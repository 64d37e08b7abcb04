"""``make cluster``: real Kubernetes on this machine and the real operator, for trying kubectl by hand.

    python -m rlkube_devcluster [--nodes 2] [--backoff-speedup 10]
    python -m rlkube_devcluster --simulate-training [--epoch-seconds 3]

Prints the KUBECONFIG to export, then runs until Ctrl-C (and cleans up its processes and files).

The control plane is the real one (:mod:`.real_cluster`: etcd, kube-apiserver,
kube-controller-manager and kube-scheduler built by ``make controlplane``) with ``--nodes`` node
agents that run the pods the scheduler binds to them as local processes (``rlkube pod``, with the
env a cluster gives them), so an applied RLJob really trains and ``kubectl get rlj`` shows its
progress. Pod logs are files under ``<workdir>/nodes/<node>/logs``.

With ``--simulate-training`` nothing of rlkube runs in the pods (each container is ``sleep
infinity``: pods are Running and Ready) and each RLJob's coordinator is faked: it reports one epoch
every ``--epoch-seconds`` and finishes at ``spec.train.maxEpochs``, so phases, printer columns,
``kubectl wait --for=condition=Complete`` and the cleanup can be watched without the runtime.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any

from rlkube.launch.processes import RestartBackOff
from rlkube.launch.signals import stop_on_signals

from rlkube_devcluster import REPO
from rlkube_devcluster.controlplane.build import kubernetes_version
from rlkube_devcluster.coordinators import FakeCoordinators
from rlkube_devcluster.kubelet.api_client import KubeApi
from rlkube_devcluster.kueue.build import KUEUE_VERSION
from rlkube_devcluster.operator_process import OperatorProcess
from rlkube_devcluster.real_cluster import RealCluster

#: What a stand-in container runs with --simulate-training.
STAND_IN = ("sleep", "infinity")


class TrainingSimulator:
    """A fake coordinator per RLJob whose epoch advances with wall time."""

    def __init__(self, api: KubeApi, coordinators: FakeCoordinators, *, epoch_seconds: float) -> None:
        self.api = api
        self.coordinators = coordinators
        self.epoch_seconds = epoch_seconds
        self.started: dict[str, float] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="training-simulator", daemon=True)

    def _jobs(self) -> list[dict[str, Any]]:
        return list(self.api.get("/apis/rlkube.io/v1alpha1/rljobs")["items"])

    def _run(self) -> None:
        while not self.stop.wait(1.0):
            try:
                jobs = self._jobs()
            except Exception:  # the API server is stopping, or busy: try again next second
                continue
            for job in jobs:
                self._report(job)

    def _report(self, job: dict[str, Any]) -> None:
        meta, spec = job["metadata"], job.get("spec", {})
        key = f"{meta['namespace']}.{meta['name']}.{meta['uid']}"
        if spec.get("runPolicy", {}).get("suspend"):
            return
        start = self.started.setdefault(key, time.monotonic())
        max_epochs = int(spec.get("train", {}).get("maxEpochs", 100))
        epoch = min(max_epochs, int((time.monotonic() - start) / self.epoch_seconds))
        steps = epoch * int(spec.get("train", {}).get("stepsPerEpoch", 2048))
        self.coordinators.report(
            meta["namespace"],
            meta["name"],
            phase="Complete" if epoch >= max_epochs else "Running",
            finished=epoch >= max_epochs,
            epoch=epoch,
            max_epochs=max_epochs,
            weight_version=epoch,
            env_steps=steps,
            episodes=steps // 50,
            last_return=min(500.0, 20.0 + 10.0 * epoch),
            last_sync_time=time.time(),
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make cluster", description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2, help="node agents pods are spread over")
    parser.add_argument(
        "--simulate-training",
        action="store_true",
        help="run nothing in the pods and fake each job's coordinator",
    )
    parser.add_argument("--epoch-seconds", type=float, default=3.0, help="simulated seconds per epoch")
    parser.add_argument(
        "--backoff-speedup",
        type=float,
        default=1.0,
        help="divide the kubelet's CrashLoopBackOff (10 s doubling to 5 min) by this (e.g. 10)",
    )
    parser.add_argument(
        "--kueue", action="store_true", help="run Kueue beside the control plane (make kueue)"
    )
    parser.add_argument("--workdir", type=Path, default=REPO / "runs" / "cluster", help="kubeconfig and logs")
    args = parser.parse_args(argv)

    shutil.rmtree(args.workdir, ignore_errors=True)
    args.workdir.mkdir(parents=True)
    cluster = RealCluster(
        args.workdir,
        nodes=args.nodes,
        backoff=RestartBackOff.kubelet(speedup=args.backoff_speedup),
        stand_in=STAND_IN if args.simulate_training else None,
        kueue=args.kueue,
    )
    operator = OperatorProcess(
        cluster.kubeconfig,
        socket_dir=cluster.socket_dir,
        log=args.workdir / "operator.log",
        env={"RLKUBE_STATUS_INTERVAL": "2"},
    )
    coordinators = FakeCoordinators(cluster.socket_dir)
    simulator: TrainingSimulator | None = None
    stopping = threading.Event()
    stop_on_signals(stopping)
    try:
        cluster.start()
        operator.start()
        if args.simulate_training:
            simulator = TrainingSimulator(
                KubeApi(cluster.kubeconfig), coordinators, epoch_seconds=args.epoch_seconds
            )
            simulator.thread.start()
        logs = args.workdir / "nodes"
        runs = (
            "pods run nothing (sleep infinity) and training is simulated"
            if args.simulate_training
            else f"pods run as processes on {args.nodes} node agents; their logs: {logs}/<node>/logs"
        )
        print(
            f"Kubernetes {kubernetes_version()} at {cluster.plane.url} "
            f"(logs: {cluster.plane.workdir / 'logs'}); operator log {operator.log_path}\n"
            f"{runs}\ncoordinator proxies (the operator's way in): "
            f"{cluster.socket_dir}/<namespace>.<job>.sock\n"
            + (f"Kueue {KUEUE_VERSION} beside it (log: {cluster.kueue.log})\n" if cluster.kueue else "")
            + "\n"
            f"    export KUBECONFIG={cluster.kubeconfig}\n\n"
            "    kubectl version\n"
            "    kubectl apply -f examples/rljob.yaml\n"
            "    kubectl get rlj,sts,pods -o wide     # or: watch kubectl get rlj\n"
            "    kubectl scale rlj/cartpole-ppo --replicas=3\n"
            "    kubectl explain rlj.spec.scheduling\n"
            "    kubectl wait --for=condition=Complete rlj/cartpole-ppo --timeout=10m\n"
            "    kubectl delete rlj cartpole-ppo\n\n"
            "Ctrl-C stops.",
            flush=True,
        )
        while not stopping.wait(1.0):
            if operator.process is not None and operator.process.poll() is not None:
                print(f"the operator exited:\n{operator.log()[-3000:]}", file=sys.stderr)
                return 1
    finally:
        if simulator is not None:
            simulator.stop.set()
        operator.stop()
        coordinators.stop()
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
