"""``rlkube run --in-process``: a cluster's rank-0 engine and one eval worker, in this process.

I/O (runs environments, writes the run directory). The same objects a cluster runs, wired
without a network: train rank 0's :class:`~rlkube.coordinator.state.Coordinator` and engine
(``SyncEngine``, ``AsyncEngine`` or ``EvalEngine``, chosen by ``spec.engine`` from the same
table as a train pod) in the calling thread, and one pod's
:class:`~rlkube.engine.worker.EvalWorker` in a thread beside it. The worker speaks to the
coordinator through :class:`~rlkube.coordinator.in_process.InProcessClient` (the gRPC
servicer's own methods, called directly) and loads weights with strategy ``None`` semantics from
:mod:`rlkube.weights.in_process` (a direct load of the published state). So leasing, checkpoints
(save and restore), the evaluation cadence, seeding, metrics and reports are the cluster's code.

What differs from a cluster, on purpose: one train rank (no DDP; ``trainer.replicas`` is
ignored), one eval worker (``evaluator.replicas`` is ignored), weights always move as strategy
``None``, and silent workers are never expired (a breakpoint may hold one for as long as you
like). A failure in the eval worker ends the run with the worker's own exception.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence

import torch

from rlkube.contract import CoordinatorPhase, PodEnv, Role
from rlkube.coordinator.in_process import InProcessClient
from rlkube.coordinator.state import Coordinator
from rlkube.engine.checkpoint import CheckpointStore
from rlkube.engine.ranks import RankChannel
from rlkube.engine.report import RunObserver, RunSummary, notify
from rlkube.engine.run_paths import RunPaths
from rlkube.engine.trainer import TrainContext
from rlkube.engine.worker import EvalWorker
from rlkube.launch.results import summary_from_json
from rlkube.launch.train import ENGINES, env_meta, trajectory_spaces
from rlkube.policy.base import BasePolicy, PolicyRole, seed_everything
from rlkube.spec import PolicySpec, RLJob, WeightStrategy
from rlkube.weights.in_process import InProcessPublisher, in_process_plane

logger = logging.getLogger(__name__)

#: The simulated node of the in-process eval worker (it names the worker in status and reports).
NODE_NAME = "in-process"


def torch_threads(environ: Mapping[str, str]) -> int:
    """Intra-op threads for the in-process run: ``OMP_NUM_THREADS`` if set, else 1.

    The loop alternates small inference calls, env steps and small updates in one process. On
    the 2-core machines here, two threads were no faster than one when idle and up to ~5x slower
    when other processes competed for the cores (15 CartPole epochs: 4.7 s vs 22 s).
    """
    try:
        return max(1, int(environ.get("OMP_NUM_THREADS", "1")))
    except ValueError:
        return 1


def with_strategy_none(policy: PolicySpec) -> PolicySpec:
    """The policy spec as the in-process run uses it: weights move synchronously, no updater thread."""
    buffer = policy.weight_buffer.model_copy(update={"strategy": WeightStrategy.NONE})
    return policy.model_copy(update={"weight_buffer": buffer})


def in_process_job(job: RLJob) -> RLJob:
    """``job`` with one train rank, one eval worker and strategy None (see the module docstring)."""
    spec = job.spec.model_copy(
        update={
            "policy": with_strategy_none(job.spec.policy),
            "trainer": job.spec.trainer.model_copy(update={"replicas": 1}),
            "evaluator": job.spec.evaluator.model_copy(update={"replicas": 1}),
        }
    )
    return job.model_copy(update={"spec": spec})


def worker_env(job: RLJob, paths: RunPaths) -> PodEnv:
    """The env contract of the in-process eval worker, eval pod 0 (no address, port or shm is used)."""
    return PodEnv(
        job_name=job.name,
        namespace="default",
        role=Role.EVAL,
        replica_index=0,
        pod_name=f"{job.name}-eval-0",
        node_name=NODE_NAME,
        coordinator_addr=NODE_NAME,
        shm_dir=paths.run_dir,
        run_dir=paths.run_dir,
        job_config=paths.job,
        weight_port=0,
    )


class InProcessRun:
    """Construct (validates the policy's settings; nothing starts), then :meth:`run`."""

    def __init__(
        self,
        job: RLJob,
        policy_cls: type[BasePolicy],
        *,
        paths: RunPaths,
        observers: Sequence[RunObserver] = (),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.job = in_process_job(job)
        self.policy_cls = policy_cls
        self.paths = paths
        self.observers = list(observers)
        self.clock = clock
        self.train_policy = policy_cls(self.job.spec.policy, PolicyRole.TRAIN)
        self.worker: EvalWorker | None = None

    @property
    def eval_policy(self) -> BasePolicy:
        """The eval worker's EVAL policy (once :meth:`run` started it)."""
        if self.worker is None or self.worker.policy is None:
            raise RuntimeError("the eval worker has not started")
        return self.worker.policy

    def run(self) -> RunSummary:
        previous_threads = torch.get_num_threads()
        torch.set_num_threads(torch_threads(os.environ))
        try:
            return self._run()
        finally:
            self.train_policy.close()
            torch.set_num_threads(previous_threads)

    def _run(self) -> RunSummary:
        job, spec = self.job, self.job.spec
        done = CheckpointStore(self.paths.checkpoints).completion() if spec.checkpoint.resume else None
        if done is not None:
            logger.info("%s is complete (%s); not training again", job.name, self.paths.checkpoints)
            summary = summary_from_json(done, already_complete=True)
            notify(self.observers, "on_finish", summary)
            return summary
        # As train rank 0 of a pod: seed, build the TRAIN policy, then the engine restores and publishes.
        seed_everything(spec.train.seed)
        meta = env_meta(job)
        self.train_policy.init_train(spec.train, env_meta=meta)
        spaces = trajectory_spaces(meta, type(self.train_policy))
        coordinator = Coordinator(job, world_size=1, spaces=spaces)
        publisher = InProcessPublisher(incarnation=coordinator.incarnation)
        ctx = TrainContext(
            job=job,
            policy=self.train_policy,
            channel=RankChannel(),
            paths=self.paths,
            publisher=publisher,
            coordinator=coordinator,
            observers=self.observers,
            clock=self.clock,
        )
        engine = ENGINES[spec.engine](ctx)
        pod = worker_env(job, self.paths)
        worker_stop = threading.Event()
        worker = self.worker = EvalWorker(
            job,
            pod,
            self.policy_cls,
            stop=worker_stop,
            client=InProcessClient(coordinator),
            plane=in_process_plane(publisher, worker_id=pod.pod_name, node_name=pod.node_name),
        )
        failures: list[BaseException] = []

        def serve() -> None:
            try:
                worker.run()
            except BaseException as exc:  # the engine must not wait for a worker that is gone
                failures.append(exc)
                ctx.stop.set()
                coordinator.finish(phase=CoordinatorPhase.FAILED, message=f"the eval worker failed: {exc}")
                worker.ready.set()

        thread = threading.Thread(target=serve, name=pod.pod_name, daemon=True)
        thread.start()
        try:
            # The worker builds its policy and envs first: the trainer's RNG draws then come in one order.
            worker.ready.wait()
            if failures:
                raise failures[0]
            return engine.run()
        except BaseException:
            if failures:  # the engine only noticed that its worker had gone: the worker's error is the cause
                raise failures[0] from None
            raise
        finally:
            if not coordinator.snapshot.finished:
                coordinator.finish(phase=CoordinatorPhase.FAILED, message="stopped")
            worker_stop.set()
            thread.join()
