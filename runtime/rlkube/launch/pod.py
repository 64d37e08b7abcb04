"""``rlkube pod`` (also ``python -m rlkube.launch.pod``): the entrypoint of every train and eval pod.

I/O. Reads the env contract (``rlkube.contract``; a missing or malformed variable is an error
naming it, exit 2), the job manifest it points to, imports the job's modules, and runs this
pod's role: a train rank (``rlkube.launch.train``) or an eval worker
(``rlkube.engine.worker``). SIGTERM asks for a clean stop: eval workers drain, rank 0 saves a
checkpoint. Exit codes: 0 stopped cleanly, 1 failed, 2 bad contract or job, 3 a disk fault (one line
saying what could not be written where), 143 stopped mid-run.

Every start-up refusal (exit 2) and every crash (exit 1) is also written as the container's
termination message (:mod:`rlkube.launch.termination`): a reason (``InvalidSpec``,
``PolicyNotRegistered``, ``EnvNotFound``, ``CheckpointNotFound``, ``PolicyError``, ...; see
:class:`rlkube.contract.FailureReason`) and the message, which the operator shows in the job's
``Failed`` condition. The start-up checks are :func:`rlkube.launch.preflight.preflight`, the same
that ``rlkube validate`` and ``rlkube run`` make.
"""

from __future__ import annotations

import argparse
import gc
import inspect
import logging
import os
import sys
import threading
import traceback
from pathlib import Path
from types import TracebackType

from rlkube.contract import EnvContractError, FailureReason, PodEnv, Role, read_pod_env
from rlkube.engine.disk import EXIT_DISK_FAULT, describe, is_disk_error
from rlkube.failure import describe_exception
from rlkube.health import POD
from rlkube.jobfile import load_job
from rlkube.launch.allocator import keep_large_buffers_in_heap
from rlkube.launch.processes import die_with_supervisor, wait_as_standby
from rlkube.launch.signals import stop_on_signals
from rlkube.launch.termination import write_termination_message
from rlkube.placement import TrainPlacement
from rlkube.spec import Backend, RLJob, SpecError

logger = logging.getLogger("rlkube.pod")

EXIT_FAILED = 1
EXIT_INVALID = 2


def refuse(reason: FailureReason, message: str) -> int:
    """Say why this pod will not start (stderr and the termination message); the exit code."""
    print(f"rlkube pod: {reason.value}: {message}", file=sys.stderr)
    write_termination_message(reason, message)
    return EXIT_INVALID


def _pod_placement(env: PodEnv) -> TrainPlacement | None:
    """A train pod is one rank on the GPUs it sees, over the backend the operator chose for it."""
    if not env.is_train or not env.backend:
        return None
    from rlkube.launch.preflight import local_gpus

    return TrainPlacement(
        Backend(env.backend),
        ranks_per_node=1,
        gpus_per_node=local_gpus(),
        where="in this train pod",
        resolved_because="RLKUBE_BACKEND, from spec.trainer.backend and the pod's nvidia.com/gpu limit",
    )


def main(args: argparse.Namespace | None = None) -> int:
    if not die_with_supervisor(os.environ):
        return 143
    keep_large_buffers_in_heap()  # before any thread starts allocating fragments' buffers
    if not wait_as_standby(os.environ, _warm_up):  # rlkube run --standby: not needed after all
        return 143
    try:
        env = read_pod_env(os.environ)
    except EnvContractError as exc:
        return refuse(FailureReason.ENV_CONTRACT_BROKEN, str(exc))
    try:
        job = load_job(env.job_config)
    except SpecError as exc:
        return refuse(FailureReason.INVALID_SPEC, "; ".join(exc.problems))
    _configure_logging(job, env)
    from rlkube.launch.preflight import checkpoint_needed, preflight

    checks = preflight(
        job, check_checkpoint=env.is_train and checkpoint_needed(job), placement=_pod_placement(env)
    )
    if checks.refusal is not None:
        return refuse(checks.refusal.reason, f"invalid job {env.job_config}: {checks.refusal.message}")
    policy_cls = checks.policy_cls
    assert policy_cls is not None
    stop = threading.Event()
    stop_on_signals(stop)  # SIGTERM and SIGINT, however many (rlkube.launch.signals says why)
    POD.serve()  # liveness now; readiness when the role says so
    try:
        return run_role(job, env, policy_cls, stop)
    except Exception as exc:
        if is_disk_error(exc):  # not a bug, and a restart does not fix it: one line, no traceback
            print(f"rlkube pod: {env.pod_name} stopped: {describe(exc)}", file=sys.stderr, flush=True)
            return EXIT_DISK_FAULT
        traceback.print_exc()
        print(f"rlkube pod: {env.pod_name} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        # The message with the policy's frame (rlkube.failure); the reason the operator acts on.
        failure = describe_exception(exc, pod=env.pod_name)
        write_termination_message(crash_reason(exc, policy_cls), failure.message)
        return EXIT_FAILED
    finally:
        POD.close()
        skip_final_collection()


def skip_final_collection() -> None:
    """Exclude every object alive now from the collections the interpreter runs as it exits.

    With torch, grpc and gymnasium loaded, those collections walk millions of objects that the
    process is about to drop anyway: measured ~4 s of an eval worker's exit on 2 busy cores,
    which every stop of a run waited for before it signalled the train ranks. Threads are still
    joined and atexit handlers still run; only the cyclic garbage is left to the OS.
    """
    gc.freeze()


def crash_reason(exc: BaseException, policy_cls: type) -> FailureReason:
    """``PolicyError`` when the policy's own module raised (a frame of it is in the traceback)."""
    source = inspect.getsourcefile(policy_cls)
    if source and _raised_in(exc.__traceback__, Path(source).resolve()):
        return FailureReason.POLICY_ERROR
    return FailureReason.CRASHED


def _raised_in(tb: TracebackType | None, source: Path) -> bool:
    while tb is not None:
        if Path(tb.tb_frame.f_code.co_filename).resolve() == source:
            return True
        tb = tb.tb_next
    return False


def run_role(job: RLJob, env: PodEnv, policy_cls: type, stop: threading.Event) -> int:
    from rlkube.engine.pod_metrics import start_pod_metrics

    metrics = start_pod_metrics(env)  # /metrics on RLKUBE_METRICS_PORT, for the pod's whole life
    try:
        if env.role is Role.TRAIN:
            from rlkube.launch.train import run_train_rank

            return run_train_rank(job, env, policy_cls, stop=stop)
        from rlkube.engine.worker import EvalWorker

        return EvalWorker(job, env, policy_cls, stop=stop).run()
    finally:
        if metrics is not None:
            metrics.close()


def _warm_up() -> None:
    """What a standby train rank imports before it is needed (the seconds a restart would spend)."""
    import rlkube.engine.pod_metrics
    import rlkube.launch.preflight
    import rlkube.launch.train  # noqa: F401  (torch, the engines, the coordinator)


def _configure_logging(job: RLJob, env: PodEnv) -> None:
    logging.basicConfig(
        level=job.spec.log.level.value.upper(),
        format=f"%(asctime)s %(levelname)s {env.pod_name} %(name)s: %(message)s",
        stream=sys.stdout,
    )
    logging.getLogger("matplotlib").setLevel(logging.WARNING)


if __name__ == "__main__":
    sys.exit(main())
