"""The product on a GPU, as a user runs it: `rlkube run` jobs with the learner on the GPU.

I/O (runs ``rlkube run`` processes; see :mod:`benchmarks.gpu.runs`). Every section returns its
figures or raises (AssertionError: failed; :class:`Skipped`: cannot run here). ``small`` is the
CPU fallback (``RLKUBE_GPU_CHECK_CPU=1`` or no CUDA): the same code on tiny jobs, so the
test suite runs it; the learning and speed claims are only made on a GPU.

=============  ==========================================================================
section        what it proves (GPU)
=============  ==========================================================================
placement      2 NCCL ranks on a 1-GPU machine are refused before anything starts,
               with the fix named (``rlkube run`` exits 2, no run directory)
cartpole       ``examples/cartpole.yaml``, 1 train rank on ``cuda:0``, reaches its
               ``targetReturn`` (475)
halfcheetah    HalfCheetah-v5, 8 eval workers, a few epochs: env steps/s with the learner
               (and eval policies) on the GPU, then the same job with CUDA hidden
               (fallback: CartPole, --in-process)
checkpoint     a GPU learner checkpoints, is SIGKILLed with its pods, and a second
               ``rlkube run`` on the same run directory resumes and finishes
               (fallback: one --in-process run killed and resumed)
ddp            2 train ranks over NCCL, each on its own GPU (skipped with one GPU)
=============  ==========================================================================
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.gpu.runs import (
    ROOT,
    Finished,
    child_env,
    rlkube_command,
    run,
    steps_per_second,
    train_devices,
)

CARTPOLE = ROOT / "examples" / "cartpole.yaml"
HALFCHEETAH = ROOT / "examples" / "halfcheetah.yaml"

#: A CartPole job small enough for 2 busy cores: 1 train rank, 1 eval worker, 256 steps an epoch.
SMALL_CARTPOLE = (
    "spec.trainer.replicas=1",
    "spec.evaluator.replicas=1",
    "spec.train.stepsPerEpoch=256",
    "spec.train.batchSize=128",
    "spec.policy.algoCfg.updateEpochs=2",
    "spec.train.evalInterval=0",
)


class Skipped(Exception):
    """The section cannot run on this machine; the message says why."""


class Workspace:
    """One temporary directory for every run of the check (removed at the end)."""

    def __init__(self) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="rlkube-gpu-check-runs-")
        self.root = Path(self._tmp.name)

    def run_dir(self, name: str) -> Path:
        return self.root / name

    def close(self) -> None:
        self._tmp.cleanup()


def _expect_device(finished: Finished, job: str, ranks: int, device_type: str) -> list[str]:
    devices = train_devices(finished, ranks, job)
    if not all(d.startswith(device_type) for d in devices):
        raise AssertionError(
            f"train ranks logged devices {devices}, expected {device_type}:\n{finished.tail()}"
        )
    return devices


def _ran(finished: Finished) -> dict[str, Any]:
    if finished.returncode != 0:
        raise AssertionError(f"rlkube run exited {finished.returncode}:\n{finished.tail()}")
    return finished.summary()


# ------------------------------------------------------------------------------- placement
def placement(ws: Workspace, *, gpus: int, small: bool) -> dict[str, Any]:
    wanted = gpus + 1 if gpus else 2
    if small or gpus == 0:  # no GPU to oversubscribe: the same rule, as `rlkube run` applies it
        from rlkube.jobfile import load_job
        from rlkube.placement import TrainPlacement, placement_problems

        job = load_job(CARTPOLE, [f"spec.trainer.replicas={wanted}"])
        problems = placement_problems(TrainPlacement.local(job.spec, gpus=1))
        if not problems or "--set spec.trainer.replicas=1" not in problems[0]:
            raise AssertionError(f"2 NCCL ranks on 1 GPU were not refused: {problems}")
        return {"ranks": wanted, "gpus": "1 (simulated)", "refused": True}
    run_dir = ws.run_dir("placement")
    finished = run(
        rlkube_command(CARTPOLE, run_dir=run_dir, overrides=[f"spec.trainer.replicas={wanted}"]),
        run_dir=run_dir,
        timeout=90,
    )
    fix = f"--set spec.trainer.replicas={gpus}"
    if finished.returncode != 2 or fix not in finished.output:
        raise AssertionError(f"expected exit 2 naming {fix!r}, got {finished.returncode}:\n{finished.tail()}")
    if run_dir.exists():
        raise AssertionError(f"the refused run created {run_dir}")
    return {"ranks": wanted, "gpus": gpus, "refused": True, "exit": 2, "seconds": round(finished.seconds, 1)}


# ------------------------------------------------------------------------------- cartpole
def cartpole(ws: Workspace, *, small: bool) -> dict[str, Any]:
    run_dir = ws.run_dir("cartpole")
    if small:
        overrides: Sequence[str] = (*SMALL_CARTPOLE, "spec.train.maxEpochs=2")
    else:
        overrides = ("spec.trainer.replicas=1",)
    finished = run(
        rlkube_command(CARTPOLE, run_dir=run_dir, overrides=overrides), run_dir=run_dir, timeout=240
    )
    summary = _ran(finished)
    devices = _expect_device(finished, "cartpole", 1, "cpu" if small else "cuda")
    figures = {
        "learner": devices[0],
        "epochs": summary["epochs"],
        "env_steps": summary["env_steps"],
        "final_return": _round(summary.get("final_return")),
        "env_steps_to_475": summary.get("env_steps_to_target"),
        "steps_per_s": round(steps_per_second(summary)),
        "wall_s": round(finished.seconds, 1),
    }
    if not small and (
        summary.get("stop_reason") != "target_return" or summary.get("env_steps_to_target") is None
    ):
        raise AssertionError(f"CartPole did not reach its target return 475: {summary}")
    if not summary.get("fingerprints_consistent", False):
        raise AssertionError("the eval workers' weight fingerprints differ from the trainer's")
    return figures


# ------------------------------------------------------------------------------- halfcheetah
def halfcheetah(ws: Workspace, *, small: bool, epochs: int) -> dict[str, Any]:
    if small:  # no MuJoCo needed: CartPole, 2 eval workers, the same two runs
        job, name = CARTPOLE, "cartpole"
        overrides: list[str] = [*SMALL_CARTPOLE, "spec.train.maxEpochs=2", "spec.evaluator.replicas=2"]
    else:
        from benchmarks.gpu.packages import MUJOCO, describe_missing, missing

        lacking = missing(MUJOCO)
        if lacking:
            raise AssertionError(
                "HalfCheetah-v5 needs packages this interpreter lacks:\n" + describe_missing(lacking)
            )
        job, name = HALFCHEETAH, "halfcheetah"
        overrides = [
            "spec.evaluator.replicas=8",
            "spec.train.fragmentLength=256",  # 8 workers x 256 steps = one 2048-step epoch
            f"spec.train.maxEpochs={epochs}",
            "spec.train.evalInterval=0",
            "spec.train.saveInterval=0",
        ]
    figures: dict[str, Any] = {}
    rates = {}
    for side, extra in (("gpu", {}), ("cpu", {"CUDA_VISIBLE_DEVICES": ""})):
        run_dir = ws.run_dir(f"halfcheetah-{side}")
        finished = run(
            rlkube_command(job, run_dir=run_dir, overrides=overrides, in_process=small),
            run_dir=run_dir,
            timeout=150,
            env=child_env(extra),
        )
        summary = _ran(finished)
        if small:  # one process: no train pod to log its device
            figures[f"{side}_learner"] = "in-process"
        else:
            figures[f"{side}_learner"] = _expect_device(
                finished, name, 1, "cuda" if side == "gpu" else "cpu"
            )[0]
        rates[side] = steps_per_second(summary)
        figures[f"{side}_steps_per_s"] = round(rates[side])
        figures[f"{side}_wall_s"] = round(finished.seconds, 1)
        if not small and not summary.get("fingerprints_consistent", False):
            raise AssertionError(f"{side}: the eval workers' weight fingerprints differ from the trainer's")
    figures["epochs"] = 2 if small else epochs
    figures["gpu_over_cpu"] = round(rates["gpu"] / max(rates["cpu"], 1e-9), 2)
    return figures


# ------------------------------------------------------------------------------- checkpoint
def checkpoint(ws: Workspace, *, small: bool) -> dict[str, Any]:
    """Train, crash (SIGKILL) once a checkpoint is down, resume, and finish two epochs later.

    The crashed leg is given far more epochs than it can run before the kill, so the kill never
    races the run's end however fast the machine is; the resumed leg ends two epochs after the
    newest checkpoint it finds.
    """
    run_dir = ws.run_dir("resume")
    kill_after = 2 if small else 4
    base = [
        *(SMALL_CARTPOLE if small else ("spec.trainer.replicas=1",)),
        f"spec.train.saveInterval={1 if small else 2}",
        "spec.train.targetReturn=10000",  # never reached: each leg ends at maxEpochs
    ]

    def command(max_epochs: int) -> list[str]:
        overrides = [*base, f"spec.train.maxEpochs={max_epochs}"]
        # The CPU fallback kills and resumes one process (--in-process): the same checkpoint store.
        return rlkube_command(CARTPOLE, run_dir=run_dir, overrides=overrides, in_process=small)

    store = run_dir / "checkpoints"

    def reached() -> bool:  # any checkpoint at or past kill_after (older ones are pruned as it goes)
        return _saved_epochs(store)[-1:] >= [kill_after]

    killed = run(command(100_000), run_dir=run_dir, timeout=150, until=reached)
    if (run_dir / "summary.json").exists():
        raise AssertionError(f"the run ended before it could be killed:\n{killed.tail()}")
    saved = _saved_epochs(store)
    if saved[-1:] < [kill_after]:
        raise AssertionError(f"no checkpoint at epoch {kill_after} or later:\n{killed.tail()}")
    if not small:
        _expect_device(killed, "cartpole", 1, "cuda")
    newest = saved[-1]
    resumed = run(command(newest + 2), run_dir=run_dir, timeout=150)
    summary = _ran(resumed)
    learner = "in-process" if small else _expect_device(resumed, "cartpole", 1, "cuda")[0]
    start = summary.get("resumed_from_epoch")
    if start != newest or summary["epochs"] != newest + 2:
        raise AssertionError(f"expected a resume from epoch {newest} to {newest + 2}: {summary}")
    return {
        "learner": learner,
        "killed_after_epoch": newest,
        "resumed_from_epoch": start,
        "epochs": summary["epochs"],
        "resume_wall_s": round(resumed.seconds, 1),
    }


def _saved_epochs(store: Path) -> list[int]:
    """Epochs of the complete checkpoints under ``store`` (a meta.json is written last), oldest first."""
    if not store.is_dir():
        return []
    found = (re.fullmatch(r"ckpt-(\d+)", d.name) for d in store.iterdir() if (d / "meta.json").is_file())
    return sorted(int(m[1]) for m in found if m)


# ------------------------------------------------------------------------------- ddp
def ddp(ws: Workspace, *, gpus: int, small: bool) -> dict[str, Any]:
    if small or gpus < 2:
        raise Skipped(f"needs a second GPU ({gpus} visible)")
    run_dir = ws.run_dir("ddp")
    overrides = ("spec.trainer.replicas=2", "spec.trainer.backend=nccl", "spec.train.maxEpochs=6")
    finished = run(
        rlkube_command(CARTPOLE, run_dir=run_dir, overrides=overrides), run_dir=run_dir, timeout=150
    )
    summary = _ran(finished)
    # Each rank sees its own GPU (CUDA_VISIBLE_DEVICES from the launcher): cuda:0 in both.
    devices = _expect_device(finished, "cartpole", 2, "cuda")
    backends = [("backend nccl" in finished.log(f"cartpole-train-{r}")) for r in range(2)]
    if not all(backends):
        raise AssertionError(f"train ranks did not all use NCCL:\n{finished.tail()}")
    if not summary.get("fingerprints_consistent", False):
        raise AssertionError("the eval workers' weight fingerprints differ from the trainer's")
    return {"ranks": 2, "backend": "nccl", "devices": "/".join(devices), "epochs": summary["epochs"]}


def _round(value: Any) -> Any:
    return round(value, 1) if isinstance(value, float) else value
