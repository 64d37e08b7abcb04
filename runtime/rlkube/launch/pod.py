"""``rlkube pod`` (also ``python -m rlkube.launch.pod``): the entrypoint of every train and eval pod.

I/O. Reads the env contract (``rlkube.contract``; a missing or malformed variable is an error
naming it, exit 2), the job manifest it points to, imports the job's modules, and runs this
pod's role: a train rank (``rlkube.launch.train``) or an eval worker
(``rlkube.engine.worker``). SIGTERM asks for a clean stop: eval workers drain, rank 0 saves a
checkpoint. Exit codes: 0 stopped cleanly, 1 failed, 2 bad contract or job, 3 a disk fault (one line
saying what could not be written where), 143 stopped mid-run.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import traceback

from rlkube.contract import EnvContractError, PodEnv, Role, read_pod_env
from rlkube.engine.disk import EXIT_DISK_FAULT, describe, is_disk_error
from rlkube.health import POD
from rlkube.jobfile import load_job
from rlkube.launch.processes import die_with_supervisor
from rlkube.spec import RLJob, SpecError

logger = logging.getLogger("rlkube.pod")


def main(args: argparse.Namespace | None = None) -> int:
    if not die_with_supervisor(os.environ):
        return 143
    try:
        env = read_pod_env(os.environ)
    except EnvContractError as exc:
        print(f"rlkube pod: {exc}", file=sys.stderr)
        return 2
    try:
        job = load_job(env.job_config)
    except SpecError as exc:
        print(f"rlkube pod: {exc}", file=sys.stderr)
        return 2
    _configure_logging(job, env)
    from rlkube.launch.run import resolve_policy

    try:
        policy_cls = resolve_policy(job)
    except (ImportError, KeyError) as exc:
        print(f"rlkube pod: invalid job {env.job_config}: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()

    def on_sigterm(signum: int, _frame: object) -> None:
        logger.info("received %s: stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_sigterm)
    signal.signal(signal.SIGINT, on_sigterm)
    POD.serve()  # liveness now; readiness when the role says so
    try:
        return run_role(job, env, policy_cls, stop)
    except Exception as exc:
        if is_disk_error(exc):  # not a bug, and a restart does not fix it: one line, no traceback
            print(f"rlkube pod: {env.pod_name} stopped: {describe(exc)}", file=sys.stderr, flush=True)
            return EXIT_DISK_FAULT
        traceback.print_exc()
        print(f"rlkube pod: {env.pod_name} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    finally:
        POD.close()


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


def _configure_logging(job: RLJob, env: PodEnv) -> None:
    logging.basicConfig(
        level=job.spec.log.level.value.upper(),
        format=f"%(asctime)s %(levelname)s {env.pod_name} %(name)s: %(message)s",
        stream=sys.stdout,
    )
    logging.getLogger("matplotlib").setLevel(logging.WARNING)


if __name__ == "__main__":
    sys.exit(main())
