"""rlkube's side of the learn bench as a local cluster: what ``rlkube run JOB`` starts, for one seed.

The budgeted job (``rlkube_side.budgeted``: the seed, ``maxEpochs`` from the budget, eval
episodes off, ``targetReturn`` only with ``--to-target``), with ``evaluators`` eval workers when
given, goes to :func:`rlkube.launch.cluster_run.run_local_cluster`, the launcher of ``rlkube run``
without ``--in-process``: ``trainer.replicas`` train ranks (DDP) and the eval workers as processes
with the pod env contract, gRPC and the shm weight plane, in a temporary run directory. Its
status lines go to ``launcher.log`` there, not to the bench's output.

The curve comes from the final checkpoint train rank 0 writes (``meta.json``'s progress): every
training episode as ``(env steps, raw return, length)``, stamped by the same tracker at the end
of the epoch it finished in, as the in-process side records them from its observer. The wall
time is rank 0's run from the first eval worker's registration to the end (``summary.json``'s
``wall_seconds - seconds_to_first_worker``): like SB3's ``learn()`` and the in-process run, it
leaves out process start-up, which :attr:`Curve.startup_seconds` keeps.

Ctrl-C or SIGTERM stop every process and remove the shm directories (the launcher's own
handling) and then raise :class:`KeyboardInterrupt`; a failed run raises :class:`ClusterRunFailed`
after the same clean-up.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
import time
from pathlib import Path

from rlkube.engine.checkpoint import CheckpointStore
from rlkube.engine.run_paths import RunPaths
from rlkube.launch.cluster_run import run_local_cluster
from rlkube.spec import RLJob

from benchmarks.learn.curve import Curve, steps_to_target
from benchmarks.learn.rlkube_side import budgeted

SIDE = "rlkube-cluster"
#: What ``rlkube run`` returns when Ctrl-C or SIGTERM stopped the run.
EXIT_INTERRUPTED = 130


class ClusterRunFailed(RuntimeError):
    """The local cluster run did not finish (its processes are already stopped)."""


def with_evaluators(job: RLJob, evaluators: int | None) -> RLJob:
    """``job`` with ``evaluator.replicas = evaluators`` (None: the job's own count)."""
    if evaluators is None:
        return job
    if evaluators < 1:
        raise ValueError(f"--evaluators must be at least 1, got {evaluators}")
    spec = job.spec
    evaluator = spec.evaluator.model_copy(update={"replicas": evaluators})
    return job.model_copy(update={"spec": spec.model_copy(update={"evaluator": evaluator})})


def _launcher_args(run_dir: Path) -> argparse.Namespace:
    """What ``rlkube run JOB --run-dir RUN_DIR --no-progress`` parses to (one node, loopback)."""
    return argparse.Namespace(
        run_dir=run_dir,
        summary=None,
        nodes=1,
        no_progress=True,
        listen=None,
        netns=None,
        standby=False,
    )


def run_rlkube_cluster(
    job: RLJob, *, seed: int, budget: int, stop_at_target: bool, evaluators: int | None = None
) -> Curve:
    """``rlkube run`` (a local cluster) of the budgeted job; the curve holds raw episode returns."""
    run = with_evaluators(budgeted(job, seed=seed, budget=budget, stop_at_target=stop_at_target), evaluators)
    curve = Curve(side=SIDE, seed=seed)
    with tempfile.TemporaryDirectory(prefix="rlkube-learn-cluster-") as tmp:
        paths = RunPaths(Path(tmp) / "run")
        log = Path(tmp) / "launcher.log"
        started = time.monotonic()
        with log.open("w") as out, contextlib.redirect_stdout(out):
            code = run_local_cluster(run, _launcher_args(paths.run_dir))
        launched = time.monotonic() - started
        if code == EXIT_INTERRUPTED:
            raise KeyboardInterrupt
        if code != 0:
            raise ClusterRunFailed(
                f"{run.name} seed {seed} as a local cluster exited {code}:\n{log.read_text()[-4000:]}"
            )
        summary = json.loads(paths.summary.read_text())
        final = CheckpointStore(paths.checkpoints).latest()
        if final is None:
            raise ClusterRunFailed(f"{run.name} seed {seed}: no checkpoint in {paths.checkpoints}")
        progress = final.progress
    curve.episodes = [(steps, ret) for steps, ret, _ in progress.episodes]
    curve.env_steps = progress.env_steps
    curve.summary = summary
    startup = float(summary.get("seconds_to_first_worker") or 0.0)
    curve.wall_seconds = float(summary["wall_seconds"]) - startup
    curve.startup_seconds = launched - curve.wall_seconds
    target = job.spec.train.target_return
    if target is not None:
        curve.steps_to_target = steps_to_target(curve.episodes, target)
    return curve
