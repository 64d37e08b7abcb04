"""A train pod: rendezvous, DDP, the weight publisher and, on rank 0, the coordinator and engine.

I/O. Start-up order is what makes a cluster start in any order:

1. rank 0 serves the PolicyGroup coordinator at once (before the rendezvous), so eval workers
   and the other ranks can ask for the job's state while ranks are still coming up;
2. every other rank asks the coordinator first: if the job is already complete it idles, else it
   waits for ``MASTER_ADDR`` to resolve (DNS of a new pod lags) and joins the rendezvous that the
   rank 0 running now opened (``launch/rendezvous.py``; never one that formed before it started);
3. the ranks build the TRAIN policy (DDP-wrapped), gather each other's weight-store addresses,
   start their publishers, and rank 0 resumes from the newest checkpoint and shares it.

When the job finishes every rank stays up, idle, serving the final status, until it is stopped:
a StatefulSet restarts a pod that exits, and a restarted rank 0 that finds the completion
marker serves the final status again instead of training.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import threading
import time
from datetime import timedelta
from pathlib import Path

import torch

from rlkube import contract
from rlkube.contract import CoordinatorPhase, PodEnv
from rlkube.coordinator.client import CoordinatorError, PolicyGroupClient
from rlkube.coordinator.journal import JOURNAL_DIR, AckJournal
from rlkube.coordinator.service import CoordinatorServer
from rlkube.coordinator.state import Coordinator, EngineStatus
from rlkube.data.spaces import TrajectorySpaces
from rlkube.engine.async_engine import AsyncEngine
from rlkube.engine.checkpoint import CheckpointStore
from rlkube.engine.disk import check_writable
from rlkube.engine.eval_engine import EvalEngine
from rlkube.engine.failure import NonFiniteWeights, read_failure, recorded_reason
from rlkube.engine.loggers import run_observers
from rlkube.engine.pod_metrics import bind_coordinator
from rlkube.engine.ranks import RankChannel
from rlkube.engine.report import RunObserver
from rlkube.engine.rsl_engine import RSLEngine
from rlkube.engine.run_paths import RunPaths
from rlkube.engine.sync_engine import SyncEngine
from rlkube.engine.trainer import RankZeroEngine, Stopped, TrainContext, follow
from rlkube.envs.group import EnvGroup
from rlkube.envs.types import EnvMeta
from rlkube.health import POD
from rlkube.launch.devices import bind_train_device
from rlkube.launch.progress import PlainProgress
from rlkube.launch.rendezvous import join_process_group
from rlkube.policy.base import BasePolicy, PolicyRole, seed_everything
from rlkube.spec import Engine, RLJob
from rlkube.weights.errors import WriterBusyError
from rlkube.weights.publisher import PublisherConfig, WeightPublisher
from rlkube.weights.service import PendingWeightStore

logger = logging.getLogger(__name__)

#: How long a rank waits for MASTER_ADDR to resolve and for the rendezvous to complete.
RENDEZVOUS_TIMEOUT = timedelta(minutes=10)
ENGINES: dict[Engine, type[RankZeroEngine]] = {
    Engine.SYNC: SyncEngine,
    Engine.ASYNC: AsyncEngine,
    Engine.EVAL: EvalEngine,
    Engine.RSL: RSLEngine,
}


def env_meta(job: RLJob) -> EnvMeta:
    """The spaces of the job's env (train ranks build networks without running rollouts).

    One env in process; envpool keeps its backend (its ids are not gymnasium's).
    """
    backend = "envpool" if job.spec.env.vectorization == "envpool" else "sync"
    spec = job.spec.env.model_copy(update={"num_envs": 1, "vectorization": backend})
    with EnvGroup.from_spec(spec, base_seed=job.spec.train.seed) as group:
        group.reset()
        return group.meta


def trajectory_spaces(meta: EnvMeta, policy_cls: type[BasePolicy]) -> TrajectorySpaces:
    """What the coordinator checks fragments against: the env's spaces as rank 0 built them."""
    return TrajectorySpaces.of(
        meta.observation_space, meta.action_space, action_bounds=policy_cls.actions_within_bounds
    )


def rank_host(env: PodEnv, rank: int) -> str:
    """Where rank ``rank`` is reached: its stable DNS name in a cluster, MASTER_ADDR's host locally."""
    if env.master_addr == contract.train_rank_host(env.job_name, env.namespace, 0):
        return contract.train_rank_host(env.job_name, env.namespace, rank)
    return env.master_addr


def wait_for_dns(host: str, *, stop: threading.Event, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.getaddrinfo(host, None)
            return
        except socket.gaierror as exc:
            if stop.is_set() or time.monotonic() > deadline:
                raise RuntimeError(
                    f"MASTER_ADDR {host} does not resolve after {timeout:.0f} s: {exc}"
                ) from None
            logger.info("waiting for %s to resolve", host)
            stop.wait(2.0)


def advertised(env: PodEnv) -> str:
    return f"{rank_host(env, env.rank)}:{env.weight_port}"


def open_publisher(
    job: RLJob, env: PodEnv, *, incarnation: str | None = None, peers: tuple[str, ...] = ()
) -> WeightPublisher:
    """This rank's weight publisher, serving on the weight port; it announces ``peers`` as sources.

    Rank 0 writes the node's shared buffer directory, so eval pods on its node read the slots
    directly; an eval pod's receiver that writes it (it took over while rank 0 restarted) hands it
    back. If it does not in time, rank 0 uses a private directory and that node's pods fetch over
    gRPC instead. Other ranks always use a private directory.
    """
    private = Path(env.shm_dir) / f"train-rank-{env.rank}"
    candidates = [Path(env.shm_dir), private] if env.rank == 0 else [private]
    for directory in candidates:
        config = PublisherConfig.from_spec(
            job.spec.policy.weight_buffer,
            shm_dir=directory,
            listen=f"{env.listen_host}:{env.weight_port}",
            advertise=advertised(env),
            peers=peers,
            incarnation=incarnation,
            data_listen=f"{env.listen_host}:{env.weight_data_port}",
        )
        try:
            return WeightPublisher(config).connect()
        except WriterBusyError as exc:
            if directory == candidates[-1]:
                raise
            logger.warning(
                "%s; rank 0 publishes from %s instead (this node's pods fetch over gRPC)", exc, private
            )
    raise AssertionError("unreachable")


def run_train_rank(job: RLJob, env: PodEnv, policy_cls: type[BasePolicy], *, stop: threading.Event) -> int:
    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
    paths = RunPaths(env.run_dir)
    coordinator_port = int(env.coordinator_addr.rpartition(":")[2])
    server: CoordinatorServer | None = None
    weight_store = PendingWeightStore()  # on rank 0's coordinator server, served once publishing
    coordinator: Coordinator | None = None
    publisher: WeightPublisher | None = None
    if env.rank == 0:
        # Before anything trains: a read-only or full run directory is one line now, not a
        # traceback at the first checkpoint (rlkube pod exits 3 on it).
        check_writable(paths.run_dir, what="run directory")
        CheckpointStore(paths.checkpoints).check_writable()
        paths.create()
        done = CheckpointStore(paths.checkpoints).completion()
        failed = read_failure(paths.checkpoints)
        coordinator = Coordinator(job, world_size=env.world_size)
        if job.spec.engine is not Engine.EVAL:  # acknowledged means durable (rlkube.coordinator.journal)
            journal_dir = paths.checkpoints / JOURNAL_DIR
            if not job.spec.checkpoint.resume:
                shutil.rmtree(journal_dir, ignore_errors=True)  # a fresh start replays nothing
            coordinator.journal = AckJournal(
                journal_dir, incarnation=coordinator.incarnation, quarantine=paths.quarantine
            ).open()
        bind_coordinator(coordinator)  # rank 0's /metrics reads it
        server = CoordinatorServer(
            coordinator,
            address=f"{env.listen_host}:{coordinator_port}",
            extra_handlers=[weight_store, POD.handler()],
        ).start()
        POD.ready()  # rank 0 is ready once its coordinator answers (eval workers wait on it)
        if done is not None:
            logger.info(
                "%s is complete (%s); serving its final status", job.name, paths.checkpoints / "COMPLETE.json"
            )
            coordinator.update(
                EngineStatus(
                    epoch=int(done.get("epochs") or 0),
                    env_steps=int(done.get("env_steps") or 0),
                    last_return=done.get("final_return"),
                    eval_return=done.get("eval_return"),
                )
            )
            coordinator.finish(phase=CoordinatorPhase.COMPLETE, message="already complete")
            return _idle(stop, server)
        if failed is not None:
            logger.error("%s failed: %s; serving the failure", job.name, failed["message"])
            coordinator.finish(
                phase=CoordinatorPhase.FAILED,
                message=failed["message"],
                failure_reason=recorded_reason(failed),
            )
            return _idle(stop, server)
    elif _job_finished(env, stop):
        return _idle(stop, None)
    try:
        bind_train_device(rank=env.rank, backend=env.backend or "gloo")  # before the group and the policy
        if env.world_size > 1:
            wait_for_dns(env.master_addr, stop=stop, timeout=RENDEZVOUS_TIMEOUT.total_seconds())
            join_process_group(
                backend=env.backend or "gloo",
                master_addr=env.master_addr,
                master_port=env.master_port,
                rank=env.rank,
                world_size=env.world_size,
                timeout=RENDEZVOUS_TIMEOUT,
                stop=stop,
            )
        seed_everything(job.spec.train.seed + env.rank)
        policy = policy_cls(job.spec.policy, PolicyRole.TRAIN)
        meta = env_meta(job)
        policy.init_train(job.spec.train, env_meta=meta)
        if coordinator is not None:  # before any task is queued: every fragment is checked against them
            coordinator.spaces = trajectory_spaces(meta, policy_cls)
        channel = RankChannel()
        # Every rank serves its copy (Sharded receivers fetch ranges from all of them) under one
        # incarnation, the coordinator's: eval workers learn it when they register, and fetches and
        # loads name (incarnation, version). Rank 0 announces the other ranks as sources of each version.
        ranks = channel.gather((advertised(env), coordinator.incarnation if coordinator is not None else ""))
        peers = tuple(address for address, _ in ranks[1:]) if env.rank == 0 else ()
        publisher = open_publisher(job, env, incarnation=ranks[0][1], peers=peers)
        ctx = TrainContext(
            job=job,
            policy=policy,
            channel=channel,
            paths=paths,
            publisher=publisher,
            coordinator=coordinator,
            client=None if env.rank == 0 else PolicyGroupClient(env.coordinator_addr),
            observers=_observers(job, paths) if env.rank == 0 else (),
            stop=stop,
        )
        if env.rank == 0:
            assert coordinator is not None
            weight_store.serve(publisher.board)
            ENGINES[job.spec.engine](ctx).run()
        else:
            POD.ready()  # joined training
            follow(ctx)
    except Stopped:
        _stop_serving(server, publisher)
        return 143
    except NonFiniteWeights as exc:
        logger.error("%s", exc)  # the coordinator reports it; the job is over, not restarted
        return _idle(stop, server, publisher)
    except BaseException:
        # A failed rank must exit now, so that its pod restarts: the open WeightStore streams and
        # long polls of the servers would otherwise hold the process for a minute at exit.
        _stop_serving(server, publisher)
        raise
    return _idle(stop, server, publisher)


def _stop_serving(server: CoordinatorServer | None, publisher: WeightPublisher | None) -> None:
    if publisher is not None:
        publisher.close()
    if server is not None:
        server.stop()


def _job_finished(env: PodEnv, stop: threading.Event) -> bool:
    """Ranks > 0 ask rank 0 first: a finished job is not joined again (rank 0 idles, it won't rendezvous)."""
    with PolicyGroupClient(env.coordinator_addr) as client:
        while not stop.is_set():
            try:
                return client.status(timeout=5.0).finished
            except CoordinatorError as exc:
                logger.info("waiting for the coordinator at %s: %s", env.coordinator_addr, exc.code)
                stop.wait(2.0)
    return False


def _observers(job: RLJob, paths: RunPaths) -> list[RunObserver]:
    return [*run_observers(job, paths), PlainProgress(interval=job.spec.log.interval_seconds)]


def _idle(
    stop: threading.Event, server: CoordinatorServer | None, publisher: WeightPublisher | None = None
) -> int:
    """Stay up (serving the final status) until stopped."""
    stop.wait()
    if server is not None:
        server.stop()
    if publisher is not None:
        publisher.close()
    return 0
