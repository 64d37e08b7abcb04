"""``make cluster``: a cluster and the real operator, for trying kubectl by hand.

    python -m rlkube_devcluster [--nodes 2]                 # real Kubernetes (the default)
    python -m rlkube_devcluster --api emulator [--kubelet process|ready] [--port 8001]
    python -m rlkube_devcluster --api emulator --simulate-training [--epoch-seconds 3]

Prints the KUBECONFIG to export, then runs until Ctrl-C (and cleans up its processes and files).

``--api kubernetes`` (the default) is the real control plane (:mod:`.real_cluster`: etcd,
kube-apiserver, kube-controller-manager and kube-scheduler built by ``make controlplane``) with
``--nodes`` node agents that run the pods the scheduler binds to them as local processes, and the
operator beside it. ``--api emulator`` is the API emulator, with the options below.

``--kubelet process`` (the default) is the cluster-in-a-box: the pods of the StatefulSets the
operator creates run as local processes (``rlkube pod``, with the env a cluster gives them;
:mod:`rlkube_devcluster.kubelet.process_kubelet`), spread over ``--nodes`` simulated nodes, so an
applied RLJob really trains and ``kubectl get rlj`` shows its progress. Pod logs are files under
``<workdir>/logs``. ``--kubelet ready`` runs nothing: pods are Running and Ready at once. With
``--simulate-training`` (implies ``--kubelet ready``) each RLJob's coordinator is faked: it reports
one epoch every ``--epoch-seconds`` and finishes at ``spec.train.maxEpochs``, so phases, printer
columns, ``kubectl wait --for=condition=Complete`` and the cleanup can be watched without the runtime.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

from rlkube.launch.processes import RestartBackOff
from rlkube.launch.signals import stop_on_signals

from rlkube_devcluster import REPO
from rlkube_devcluster.controlplane.build import kubernetes_version
from rlkube_devcluster.coordinators import FakeCoordinators
from rlkube_devcluster.emulator.cluster import EmulatedCluster
from rlkube_devcluster.emulator.controllers import Kubelet, ReadyKubelet
from rlkube_devcluster.kubelet.process_kubelet import ProcessKubelet
from rlkube_devcluster.kueue.build import KUEUE_VERSION
from rlkube_devcluster.operator_process import OperatorProcess
from rlkube_devcluster.real_cluster import RealCluster


class TrainingSimulator:
    """A fake coordinator per RLJob whose epoch advances with wall time."""

    def __init__(
        self, cluster: EmulatedCluster, coordinators: FakeCoordinators, *, epoch_seconds: float
    ) -> None:
        self.cluster = cluster
        self.coordinators = coordinators
        self.epoch_seconds = epoch_seconds
        self.started: dict[str, float] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="training-simulator", daemon=True)

    def _jobs(self) -> list[dict]:
        store = self.cluster.emulator.store  # type: ignore[union-attr]
        rtype = store.find("rlkube.io", "v1alpha1", "rljobs")
        return [] if rtype is None else [dict(j) for j in store.items(rtype)]

    def _run(self) -> None:
        while not self.stop.wait(1.0):
            for job in self.cluster.call(self._jobs):
                meta, spec = job["metadata"], job.get("spec", {})
                key = f"{meta['namespace']}.{meta['name']}.{meta['uid']}"
                if spec.get("runPolicy", {}).get("suspend"):
                    continue
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
    parser.add_argument(
        "--api",
        choices=("kubernetes", "emulator"),
        default="kubernetes",
        help="kubernetes: the real control plane and node agents (default); emulator: the API emulator",
    )
    parser.add_argument("--port", type=int, default=None, help="emulator: API port (default: a free one)")
    parser.add_argument("--nodes", type=int, default=2, help="simulated nodes pods are spread over")
    parser.add_argument(
        "--kubelet",
        choices=("process", "ready"),
        default=None,
        help="process: run pods as local processes (default); ready: report them Ready, run nothing",
    )
    parser.add_argument(
        "--simulate-training", action="store_true", help="fake each job's coordinator (--kubelet ready)"
    )
    parser.add_argument("--epoch-seconds", type=float, default=3.0, help="simulated seconds per epoch")
    parser.add_argument(
        "--backoff-speedup",
        type=float,
        default=1.0,
        help="divide the kubelet's CrashLoopBackOff (10 s doubling to 5 min) by this (e.g. 10)",
    )
    parser.add_argument(
        "--kueue", action="store_true", help="kubernetes: run Kueue beside the control plane (make kueue)"
    )
    parser.add_argument("--workdir", type=Path, default=REPO / "runs" / "cluster", help="kubeconfig and logs")
    args = parser.parse_args(argv)
    if args.kubelet is None:
        args.kubelet = "ready" if args.simulate_training else "process"
    if args.simulate_training and args.kubelet == "process":
        parser.error("--simulate-training fakes the coordinators: it needs --kubelet ready")

    if args.api == "emulator" and args.kueue:
        parser.error("--kueue runs Kueue beside the real control plane: it needs --api kubernetes")
    if args.api == "kubernetes" and (args.kubelet == "ready" or args.simulate_training or args.port):
        parser.error("--kubelet ready, --simulate-training and --port are options of --api emulator")

    shutil.rmtree(args.workdir, ignore_errors=True)
    args.workdir.mkdir(parents=True)
    if args.api == "kubernetes":
        return run_kubernetes(args)
    sockets = Path(tempfile.mkdtemp(prefix="rlk"))  # unix socket paths must stay short
    kubelet: Kubelet = (
        ProcessKubelet(
            args.workdir,
            nodes=args.nodes,
            socket_dir=sockets,
            backoff=RestartBackOff.kubelet(speedup=args.backoff_speedup),
        )
        if args.kubelet == "process"
        else ReadyKubelet(args.nodes)
    )
    cluster = EmulatedCluster(
        args.workdir, kubelet=kubelet, port=args.port, crds=[REPO / "crds" / "rljob.yaml"]
    ).start()
    coordinators = FakeCoordinators(sockets)
    operator = OperatorProcess(
        cluster.operator_kubeconfig,
        socket_dir=sockets,
        log=args.workdir / "operator.log",
        env={"RLKUBE_STATUS_INTERVAL": "2"},
    )
    simulator = TrainingSimulator(cluster, coordinators, epoch_seconds=args.epoch_seconds)
    stopping = threading.Event()
    stop_on_signals(stopping)
    try:
        operator.start()
        if args.simulate_training:
            simulator.thread.start()
        runs = (
            f"pods run as processes on {args.nodes} simulated nodes; their logs: {args.workdir / 'logs'}"
            if args.kubelet == "process"
            else "pods are reported Ready; nothing runs"
            + (" (training is simulated)" if args.simulate_training else "")
        )
        print(
            f"API emulator at {cluster.url}; operator log {operator.log_path}; metrics "
            f"http://127.0.0.1:{operator.metrics_port}/metrics\n{runs}\n\n"
            f"    export KUBECONFIG={cluster.kubeconfig}\n\n"
            "    kubectl apply -f examples/rljob.yaml\n"
            "    kubectl get rlj,sts,pods -o wide     # or: watch kubectl get rlj\n"
            "    kubectl scale rlj/cartpole-ppo --replicas=6\n"
            "    kubectl describe rlj cartpole-ppo\n"
            "    kubectl wait --for=condition=Complete rlj/cartpole-ppo --timeout=10m"
            + (
                "   # needs --simulate-training"
                if args.kubelet == "ready" and not args.simulate_training
                else ""
            )
            + "\n    kubectl delete rlj cartpole-ppo\n\n"
            "(The emulator serves OpenAPI v3: kubectl validates strictly and `kubectl explain` works.) "
            "Ctrl-C stops.",
            flush=True,
        )
        while not stopping.wait(1.0):
            if operator.process is not None and operator.process.poll() is not None:
                print(f"the operator exited:\n{operator.log()[-3000:]}", file=sys.stderr)
                return 1
    finally:
        simulator.stop.set()
        operator.stop()
        coordinators.stop()
        cluster.stop()
        shutil.rmtree(sockets, ignore_errors=True)
    return 0


def run_kubernetes(args: argparse.Namespace) -> int:
    """The real control plane, node agents and the operator, until Ctrl-C."""
    cluster = RealCluster(
        args.workdir,
        nodes=args.nodes,
        backoff=RestartBackOff.kubelet(speedup=args.backoff_speedup),
        kueue=args.kueue,
    )
    operator = OperatorProcess(
        cluster.kubeconfig,
        socket_dir=cluster.socket_dir,
        log=args.workdir / "operator.log",
        env={"RLKUBE_STATUS_INTERVAL": "2"},
    )
    stopping = threading.Event()
    stop_on_signals(stopping)
    try:
        cluster.start()
        operator.start()
        logs = args.workdir / "nodes"
        print(
            f"Kubernetes {kubernetes_version()} at {cluster.plane.url} "
            f"(logs: {cluster.plane.workdir / 'logs'}); operator log {operator.log_path}\n"
            f"pods run as processes on {args.nodes} node agents; their logs: {logs}/<node>/logs\n"
            + (f"Kueue {KUEUE_VERSION} beside it (log: {cluster.kueue.log})\n" if cluster.kueue else "")
            + "\n"
            f"    export KUBECONFIG={cluster.kubeconfig}\n\n"
            "    kubectl version\n"
            "    kubectl apply -f examples/rljob.yaml\n"
            "    kubectl get rlj,sts,pods -o wide     # or: watch kubectl get rlj\n"
            "    kubectl scale rlj/cartpole-ppo --replicas=3\n"
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
        operator.stop()
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
