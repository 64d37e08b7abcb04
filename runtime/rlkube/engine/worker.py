"""The eval worker: one pod's EnvGroup and EVAL policy, leasing work from the coordinator.

I/O. Life of a worker: build its env group and EVAL policy, wire the weight plane of the job's
strategy, register (retrying until the coordinator answers), then take tasks: load the
version the task needs (and report it, with its fingerprint), roll out one fragment or play
the evaluation episodes, push the result (retried; the coordinator acknowledges a task once).
Tasks and pushes go through a :class:`~rlkube.engine.task_stream.TaskStream`: each push brings
the next task back with its acknowledgement, and is sent while the next fragment rolls out.
A heartbeat thread keeps the registration alive; a coordinator that forgot the worker (it
restarted, or expired a worker that hung) gets a new registration. A worker waiting for a
version of an incarnation that died (train rank 0 restarted) stops waiting as soon as it learns
of it (a heartbeat, or the node's buffer handing it the new incarnation's weights), drops the
task and registers again. SIGTERM drains: the fragment in progress is finished and
pushed, then the worker deregisters and exits. When the job is over the worker idles until it
is stopped (a StatefulSet would restart a pod that exits).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from rlkube._proto import policy_group_pb2 as pb
from rlkube.contract import PodEnv
from rlkube.coordinator.client import RETRYABLE, CoordinatorError, PolicyGroupClient, PushRequest
from rlkube.coordinator.wire import encode_fragment, episodes_only
from rlkube.engine.pod_metrics import bind_eval_figures
from rlkube.engine.rollout import RolloutWorker
from rlkube.engine.task_stream import TaskStream
from rlkube.envs.group import EnvGroup
from rlkube.health import POD
from rlkube.metrics.series import EvalFigures
from rlkube.policy.base import BasePolicy, PolicyRole
from rlkube.spec import RLJob
from rlkube.weight_key import WeightKey
from rlkube.weights.plane import EvalPlaneConfig, EvalWeightPlane

logger = logging.getLogger(__name__)

#: Offset between the seeds of training envs and evaluation envs (never the same episodes).
EVAL_SEED_OFFSET = 1_000_003
#: Long-poll length of LeaseTask.
LEASE_WAIT = 5.0
#: The longest pause between registrations refused with a code retrying cannot change (it doubles from 0.5 s).
REGISTER_PAUSE_CAP = 10.0


#: While waiting for weights and holding another incarnation's, ask the coordinator this often.
INCARNATION_PROBE_SECONDS = 0.5


class IncarnationChanged(Exception):
    """Train rank 0 restarted (or expired this worker) while the worker waited for its weights."""


@dataclass
class WorkerStats:
    fragments: int = 0
    evaluations: int = 0
    env_steps: int = 0
    rollout_seconds: float = 0.0
    weight_wait_seconds: float = 0.0
    rejected: list[str] = field(default_factory=list)


class EvalWorker:
    """One eval pod's life (see the module docstring).

    ``client`` and ``plane`` default to the pod's (gRPC to ``env.coordinator_addr``, the job's
    weight strategy); ``rlkube run --in-process`` passes in-process ones. ``policy`` is the EVAL
    policy once :meth:`run` built it.
    """

    def __init__(
        self,
        job: RLJob,
        env: PodEnv,
        policy_cls: type[BasePolicy],
        *,
        stop: threading.Event,
        client: PolicyGroupClient | None = None,
        plane: EvalWeightPlane | None = None,
    ) -> None:
        self.job = job
        self.env = env
        self.spec = job.spec
        self.stop = stop
        self.policy_cls = policy_cls
        self.client = client if client is not None else PolicyGroupClient(env.coordinator_addr)
        self._plane = plane
        self.policy: BasePolicy | None = None
        #: Set once the EVAL policy and its envs are built (before the worker registers).
        self.ready = threading.Event()
        self.worker_id = ""
        self.incarnation: str | None = None
        self.min_version = 0
        self.reported: WeightKey | None = None
        self.stats = WorkerStats()
        self._registered = threading.Event()
        self._probed_at = 0.0
        self._report_lock = threading.Lock()
        self._group: EnvGroup | None = None
        self._eval_group: EnvGroup | None = None
        self.tasks = TaskStream(self.client, stop=stop, on_answer=self._answered)

    # ------------------------------------------------------------------ life cycle
    def run(self) -> int:
        spec = self.spec
        self._group = EnvGroup.from_spec(
            spec.env, base_seed=spec.train.seed, replica_index=self.env.replica_index
        )
        self._group.reset()
        policy = self.policy = self.policy_cls(spec.policy, PolicyRole.EVAL)
        plane = self._plane or EvalWeightPlane(
            EvalPlaneConfig.from_spec(
                spec.policy.weight_buffer,
                shm_dir=self.env.shm_dir,
                source=self.env.coordinator_addr,
                worker_id=self.env.pod_name,  # names this pod's own buffer (Double): stable across restarts
                node_name=self.env.node_name,
            )
        )
        plane.attach(policy)
        policy.init_eval(None, env_meta=self._group.meta)
        bind_eval_figures(lambda: self.figures(policy))  # this pod's /metrics reads them
        self.ready.set()
        heartbeat = threading.Thread(target=self._heartbeat, name="heartbeat", daemon=True)
        reporter = threading.Thread(
            target=self._report_loads, args=(policy, plane), name="reporter", daemon=True
        )
        try:
            if not self._register():
                return 0
            POD.ready()
            # After registering: by then train rank 0 writes its own node's buffer, so a receiver
            # started here is elected only on nodes without a trainer.
            plane.start(policy)
            heartbeat.start()
            reporter.start()
            self._serve(policy, plane, RolloutWorker(self._group, policy, replica=self.env.replica_index))
        finally:
            self.tasks.close()  # the fragment pushed last is answered before the worker leaves
            if self.worker_id:
                try:
                    self.client.deregister(self.worker_id, "SIGTERM" if self.stop.is_set() else "finished")
                except CoordinatorError as exc:
                    logger.info("could not deregister: %s", exc)
            self.stop.set()
            policy.close()
            plane.close()
            for group in (self._group, self._eval_group):
                if group is not None:
                    group.close()
            self.client.close()
        return 0

    def figures(self, policy: BasePolicy) -> EvalFigures:
        """This worker's figures for its ``/metrics``."""
        stats = self.stats
        return EvalFigures(
            loaded_version=max(0, policy.weight_version),
            env_steps=stats.env_steps,
            fragments=stats.fragments,
            rollout_seconds=stats.rollout_seconds,
            weight_wait_seconds=stats.weight_wait_seconds,
        )

    def _register(self) -> bool:
        request = pb.RegisterRequest(
            role="eval",
            pod_name=self.env.pod_name,
            node_name=self.env.node_name,
            replica_index=self.env.replica_index,
            num_envs=self.spec.env.num_envs,
            previous_worker_id=self.worker_id,
        )
        started = time.monotonic()
        pause = 0.5
        while not self.stop.is_set():
            try:
                response = self.client.register(request, retry_for=30.0, should_stop=self.stop.is_set)
            except CoordinatorError as exc:
                logger.info("waiting for the coordinator (%.0f s): %s", time.monotonic() - started, exc)
                if exc.code not in RETRYABLE:
                    # An answer that asking again at once will not change (evicted, a credential
                    # refused, another server at the address): back off, never a tight loop.
                    self.stop.wait(pause)
                    pause = min(pause * 2, REGISTER_PAUSE_CAP)
                continue
            self.worker_id = response.worker_id
            self.tasks.bind(self.worker_id)
            incarnation = response.incarnation or None
            if incarnation != self.incarnation:  # rank 0 restarted: its version numbers start again
                self.min_version = 0
            self.incarnation = incarnation
            self.lease_seconds = response.lease_seconds or 15.0
            self.reported = None  # a new registration (maybe a new coordinator) has heard of no load yet
            # A new worker loads the newest weights before its first step.
            self.min_version = max(self.min_version, response.latest.version)
            self._registered.set()
            logger.info("registered as %s on %s", self.worker_id.partition(".")[0], self.env.node_name)
            return True
        return False

    def _heartbeat(self) -> None:
        while not self.stop.wait(max(1.0, self.lease_seconds / 3)):
            self._beat()

    def _beat(self) -> None:
        """One heartbeat; a coordinator that does not know us (it restarted, or expired us) clears
        the registration, which also ends any wait for a version of the old incarnation."""
        try:
            reply = self.client.heartbeat(pb.HeartbeatRequest(worker_id=self.worker_id))
        except CoordinatorError as exc:
            if exc.code is not None and exc.code.name == "NOT_FOUND":
                self._registered.clear()  # the coordinator restarted or expired us
            else:
                logger.debug("heartbeat failed: %s", exc)
            return
        if not reply.known:  # a coordinator that predates answering NOT_FOUND
            self._registered.clear()

    def _incarnation_gone(self, plane: EvalWeightPlane) -> bool:
        """Is the incarnation this worker waits on dead? (Checked while waiting for its weights.)

        True once the coordinator forgot us. When the node's buffer already handed the model
        another incarnation's weights, we ask at once (at most every half second) instead of
        waiting for the next heartbeat.
        """
        if not self._registered.is_set():
            return True
        key = WeightKey.of(plane.loaded_key())
        if key is None or self.incarnation is None or key.incarnation == self.incarnation:
            return False
        now = time.monotonic()
        if now - self._probed_at >= INCARNATION_PROBE_SECONDS:
            self._probed_at = now
            self._beat()
        return not self._registered.is_set()

    # ------------------------------------------------------------------ work
    def _serve(self, policy: BasePolicy, plane: EvalWeightPlane, rollout: RolloutWorker) -> None:
        while not self.stop.is_set():
            if not self._registered.is_set():
                POD.ready(False)  # readiness follows the registration
                if not self._register():
                    return
                POD.ready()
            try:
                task = self.tasks.next_task(wait_seconds=LEASE_WAIT)
            except CoordinatorError as exc:
                if exc.code is not None and exc.code.name == "NOT_FOUND":
                    self._registered.clear()  # the coordinator restarted or expired us
                else:
                    logger.info("lease failed: %s", exc)
                    self.stop.wait(1.0)
                continue
            if task.kind == pb.Task.STOP:
                logger.info("the job is finished; idling until stopped")
                self._idle()
                return
            if task.kind == pb.Task.NONE:
                continue
            try:
                waited = self._load(policy, plane, max(task.min_version, self.min_version))
            except IncarnationChanged as exc:  # the task died with its incarnation: register again
                logger.info("%s; dropping task %s and registering again", exc, task.task_id)
                self._registered.clear()
                continue
            if waited is None:  # stopped while waiting for the weights: the task goes back when we leave
                return
            if task.kind == pb.Task.COLLECT:
                self._collect(task, rollout, waited)
            elif task.kind == pb.Task.EVALUATE:
                self._evaluate(task, policy)

    def _load(self, policy: BasePolicy, plane: EvalWeightPlane, version: int) -> float | None:
        """Make the model hold at least ``version``; report a newly loaded version. Seconds waited."""
        started = time.perf_counter()
        # Versions count within one incarnation of train rank 0 (a restarted rank 0 counts again).
        waiting_for = self.incarnation
        key = WeightKey.of(
            plane.sync(
                policy,
                min_version=version,
                incarnation=waiting_for,
                timeout=120.0,
                stop=self.stop,
                abandon=lambda: self._incarnation_gone(plane),
            )
        )
        if self.stop.is_set() and (key is None or key.version < version):
            return None
        held = key is not None and key.satisfies(min_version=version, incarnation=waiting_for)
        if not held and self._incarnation_gone(plane):
            raise IncarnationChanged(f"incarnation {waiting_for} is gone while waiting for its v{version}")
        waited = time.perf_counter() - started
        if key is None or not key.satisfies(min_version=version, incarnation=self.incarnation or None):
            raise RuntimeError(f"weights v{version} did not arrive within 120 s (holding {key})")
        self._report(policy, plane)  # before the fragment: the coordinator checks it before training on it
        self.stats.weight_wait_seconds += waited
        return waited

    def _report(self, policy: BasePolicy, plane: EvalWeightPlane) -> None:
        """Tell the coordinator about a newly loaded version, with the model's fingerprint."""
        with self._report_lock:
            key = WeightKey.of(plane.loaded_key())
            if key is None or key == self.reported or not self._registered.is_set():
                return
            report = plane.loaded_report(policy)
            report.worker_id = self.worker_id
            try:
                reply = self.client.report_loaded(report)
                if not reply.consistent:
                    logger.error("loaded v%d does not match the trainer: %s", key.version, reply.detail)
            except CoordinatorError as exc:
                if exc.code is not None and exc.code.name == "NOT_FOUND":
                    self._registered.clear()  # the coordinator restarted or expired us: register again
                logger.info("could not report v%d: %s", key.version, exc)
                return
            self.reported = key

    def _report_loads(self, policy: BasePolicy, plane: EvalWeightPlane) -> None:
        """Background strategies load new versions between tasks: report them as they land."""
        while not self.stop.wait(0.25):
            self._report(policy, plane)

    def _collect(self, task: pb.Task, rollout: RolloutWorker, waited: float) -> None:
        started = time.perf_counter()
        fragment = rollout.collect(task.steps)
        seconds = time.perf_counter() - started
        message = encode_fragment(  # the tensors are copied once, straight into the request
            fragment,
            task_id=task.task_id,
            worker_id=self.worker_id,
            epoch=task.epoch,
            rollout_seconds=seconds,
            weight_wait_seconds=waited,
            lease_next=True,
        )
        self._push(message)
        self.stats.fragments += 1
        self.stats.env_steps += fragment.env_steps
        self.stats.rollout_seconds += seconds

    def _evaluate(self, task: pb.Task, policy: BasePolicy) -> None:
        if self._eval_group is None:
            self._eval_group = EnvGroup.from_spec(
                self.spec.env,
                base_seed=self.spec.train.seed + EVAL_SEED_OFFSET,
                replica_index=self.env.replica_index,
            )
        result = RolloutWorker(self._eval_group, policy).evaluate(
            task.episodes, seed=self.spec.train.seed + EVAL_SEED_OFFSET
        )
        self._push(
            episodes_only(
                result.returns,
                result.lengths,
                task_id=task.task_id,
                worker_id=self.worker_id,
                epoch=task.epoch,
                version=policy.weight_version,
            )
        )
        self.stats.evaluations += 1

    def _push(self, message: PushRequest) -> None:
        self.tasks.push(message)  # sent while the next task runs; answered in _answered

    def _answered(self, message: PushRequest, ack: pb.PushAck | None) -> None:
        if ack is not None and not ack.accepted:
            self.stats.rejected.append(message.task_id)
            logger.info("%s not accepted: %s", message.task_id, ack.reason)

    def _idle(self) -> None:
        while not self.stop.wait(3600.0):
            pass
