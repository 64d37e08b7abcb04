"""What can be refused before a job runs, without a cluster: each refusal with its failure reason.

I/O only in what it imports (the job's modules, gymnasium's registry) and, for the checkpoint,
one ``stat``. It imports torch (through the policy) and gymnasium, and nothing heavier, so a pod
refuses a bad job as soon as those are loaded. ``rlkube validate``, ``rlkube run`` and every pod
(``rlkube pod``) call :func:`preflight`, so a job is refused for the same reasons, with the same
words, everywhere; the pod writes the first refusal as its termination message
(:mod:`rlkube.launch.termination`).

Checks, in order (a later one needs the earlier ones to pass):

=========================  =======================================================  ====================
check                      what it proves                                           reason if not
=========================  =======================================================  ====================
imports                    ``spec.imports`` and ``spec.policy.module`` import       ImportFailed
policy                     ``spec.policy.type`` is registered as a BasePolicy       PolicyNotRegistered
buffer                     the policy learns from ``spec.buffer.type``              BufferNotSupported
                           (``BasePolicy.supported_buffers``), and has the
                           ``get_value`` a GAE processor bootstraps from
policy config              the policy accepts its algoCfg/modelCfg/optimCfg         PolicyConfigInvalid
env                        ``spec.env.id`` is a registered gymnasium id, or with    EnvNotFound
                           ``vectorization: envpool`` an id envpool has whose
                           wrappers and kwargs map to its options
checkpoint (if asked)      ``spec.checkpoint.path`` is a file or a checkpoint dir   CheckpointNotFound
placement (if given)       NCCL gets one GPU per train rank on the machine          InvalidSpec
                           (:mod:`rlkube.placement`)
=========================  =======================================================  ====================
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from rlkube.contract import FailureReason
from rlkube.envs.group import EnvError, check_env
from rlkube.placement import TrainPlacement, placement_problems
from rlkube.policy.base import BasePolicy, PolicyRole
from rlkube.policy.registry import POLICIES, import_modules
from rlkube.spec import Engine, GAEProcessor, RLJob, SpecError


@dataclass(frozen=True)
class Refusal:
    reason: FailureReason
    #: One line per problem, each naming its field.
    problems: tuple[str, ...]

    @property
    def message(self) -> str:
        return "; ".join(self.problems)


@dataclass
class Preflight:
    """What was checked (one line each), the policy class when it resolved, and the first refusal."""

    checked: list[str] = field(default_factory=list)
    policy_cls: type[BasePolicy] | None = None
    refusal: Refusal | None = None

    @property
    def ok(self) -> bool:
        return self.refusal is None


def resolve_policy(job: RLJob) -> type[BasePolicy]:
    """Import ``spec.imports`` and ``spec.policy.module`` (their registrations run), then look up the type.

    The current directory is importable, as with ``python -m``, so ``policy.module:
    examples.custom_policy`` works from a checkout. Raises ImportError or KeyError naming the field.
    """
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    modules = [*job.spec.imports, *([job.spec.policy.module] if job.spec.policy.module else [])]
    import_modules(modules)
    try:
        cls = POLICIES.get(job.spec.policy.type, imported=modules)
    except KeyError as exc:
        raise KeyError(f"spec.policy.type: {exc.args[0]}") from None
    if not (isinstance(cls, type) and issubclass(cls, BasePolicy)):
        raise KeyError(f"spec.policy.type: {job.spec.policy.type!r} is registered but is not a BasePolicy")
    return cls


def checkpoint_needed(job: RLJob) -> bool:
    """Whether the job cannot start without ``spec.checkpoint.path`` (the eval engine evaluates it)."""
    return job.spec.engine is Engine.EVAL


#: The policy file inside a checkpoint directory (rlkube.engine.checkpoint.POLICY_FILE; a test keeps
#: the two equal, since importing the engine here would slow every pod's start-up refusal).
POLICY_FILE = "policy.pt"


def checkpoint_file(path: str) -> Path:
    """``checkpoint.path`` may name a policy file or a checkpoint directory."""
    target = Path(path)
    return target / POLICY_FILE if target.is_dir() else target


def preflight(
    job: RLJob, *, check_checkpoint: bool = False, placement: TrainPlacement | None = None
) -> Preflight:
    """Run the checks of the module docstring; stop at the first refusal.

    ``placement``: how the train ranks share this machine's GPUs (``rlkube run``: all of them;
    a train pod: itself), checked last; None skips it (a cluster places pods itself).
    """
    result = Preflight()
    spec = job.spec
    try:
        result.policy_cls = cls = resolve_policy(job)
    except ImportError as exc:
        result.refusal = Refusal(FailureReason.IMPORT_FAILED, (str(exc),))
        return result
    except KeyError as exc:
        result.refusal = Refusal(
            FailureReason.POLICY_NOT_REGISTERED, (str(exc.args[0] if exc.args else exc),)
        )
        return result
    result.checked.append(f"spec.policy.type: {spec.policy.type!r} is registered ({cls.__module__})")
    if spec.buffer.type not in cls.supported_buffers:
        supported = ", ".join(sorted(b.value for b in cls.supported_buffers))
        result.refusal = Refusal(
            FailureReason.BUFFER_NOT_SUPPORTED,
            (
                f"spec.buffer.type: {spec.policy.type} learns from {supported} buffers only, got "
                f"{spec.buffer.type.value!r}",
            ),
        )
        return result
    result.checked.append(f"spec.buffer.type: {spec.policy.type} learns from {spec.buffer.type.value!r}")
    needs_value = [
        i
        for i, p in enumerate(spec.buffer.processors)
        if isinstance(p, GAEProcessor) and p.bootstrap == "policy"
    ]
    if needs_value and not callable(getattr(cls, "get_value", None)):
        result.refusal = Refusal(
            FailureReason.BUFFER_NOT_SUPPORTED,
            tuple(
                f"spec.buffer.processors[{i}] (GAE): bootstrap 'policy' needs "
                f"{spec.policy.type}.get_value(observations) -> values, which it lacks; "
                "define it or set bootstrap: none"
                for i in needs_value
            ),
        )
        return result
    if spec.buffer.processors:
        names = ", ".join(p.type for p in spec.buffer.processors)
        result.checked.append(f"spec.buffer.processors: {names} can run for {spec.policy.type}")
    try:
        # Constructing a policy validates its own settings without building networks.
        cls(spec.policy, PolicyRole.TRAIN)
    except SpecError as exc:
        result.refusal = Refusal(FailureReason.POLICY_CONFIG_INVALID, tuple(exc.problems))
        return result
    except (ValueError, TypeError, KeyError) as exc:
        result.refusal = Refusal(FailureReason.POLICY_CONFIG_INVALID, (f"spec.policy: {exc}",))
        return result
    result.checked.append(f"spec.policy: {spec.policy.type} accepts its algoCfg, modelCfg and optimCfg")
    try:
        env_checked = check_env(spec.env)
    except EnvError as exc:
        result.refusal = Refusal(FailureReason.ENV_NOT_FOUND, (str(exc),))
        return result
    result.checked.append(env_checked)
    if check_checkpoint and spec.checkpoint.path:
        target = checkpoint_file(spec.checkpoint.path)
        if not target.is_file():
            result.refusal = Refusal(
                FailureReason.CHECKPOINT_NOT_FOUND,
                (
                    f"spec.checkpoint.path: {spec.checkpoint.path!r} is neither a policy file nor a "
                    f"checkpoint directory holding {POLICY_FILE} ({target} does not exist)",
                ),
            )
            return result
        result.checked.append(f"spec.checkpoint.path: {target} exists")
    if placement is not None:
        problems = placement_problems(placement)
        if problems:
            result.refusal = Refusal(FailureReason.INVALID_SPEC, tuple(problems))
            return result
        result.checked.append(placement_checked(placement))
    return result


def placement_checked(placement: TrainPlacement) -> str:
    """The line a passed placement check prints."""
    ranks = f"{placement.ranks_per_node} train rank{'s' if placement.ranks_per_node > 1 else ''}"
    return (
        f"placement: {ranks} {placement.where} over {placement.backend.value}, "
        f"{placement.gpus_per_node} GPU{'s' if placement.gpus_per_node != 1 else ''} visible"
    )


def local_gpus() -> int:
    """GPUs this machine shows torch (0 without CUDA)."""
    import torch

    return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0
