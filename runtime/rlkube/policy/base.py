"""BasePolicy: RLightning's policy contract, with the weight updates its docs promise.

A user subclasses :class:`BasePolicy`, implements the eight methods (``construct_network``,
``setup_optimizer``, ``rollout_step``, ``postprocess``, ``update_dataset``, ``train``,
``get_trainable_parameters``, ``load_state_dict``; the last two have model_list defaults),
registers it with ``@POLICIES.register("Name")`` and names it in ``spec.policy.type``.

The same class runs as two roles. TRAIN: ``init_train`` builds the networks, wraps them in DDP
when there are several ranks, and sets up the optimizer. EVAL: ``init_eval`` builds the
networks in eval mode and, unless the weight strategy is ``None``, starts the updater thread.
The updater waits for ``notify_update_weights()``, stages the newest snapshot *outside* the
rollout gate, then commits it inside the gate (the sync idle gate, or the async admission gate
that stops new requests and waits for in-flight ones, see ``rlkube.policy.gates``), so rollouts
are blocked only for the pointer swap and a commit never overlaps a rollout step. The gate, the
event loop of async rollouts and the updater thread live in ``rlkube.policy.updater``; the
methods here keep RLightning's names and delegate to them.

Requests: by default ``rollout_step`` serves one env per call, as in RLightning: it receives one
env's :class:`~rlkube.envs.types.EnvRet` (``env_id`` a string, the observation without a batch
dimension) and returns that env's :class:`~rlkube.envs.types.PolicyResponse`; with ``rolloutMode:
async`` the requests of every env are in flight together on the policy's event loop (behind the
admission gate; ``get_num_requests()`` counts them). A policy that handles every env of a group in
one call declares ``request_mode = RequestMode.BATCHED`` (the built-in PPO does): its EnvRet
holds ``[N, ...]`` rows and its response must have one row per env. ``rlkube.engine.rollout``
turns both into the same ``[num_envs, T]`` fragments.

DDP: the default ``wrap_with_ddp`` wraps every model of ``model_list`` with
``find_unused_parameters=ddp_find_unused_parameters`` (True by default, as RLightning does, so a
head that a step does not use does not stop training; a policy whose steps use every parameter may
set it False and save DDP a graph traversal per step).

Checkpoints: a policy that overrides ``save_checkpoint`` but not ``load_checkpoint`` still
resumes: the checkpoint store then also writes the framework's own copy of ``model_list``
(:meth:`BasePolicy.save_models`) and resumes from it.

Note: ``train`` is the training step, as in RLightning; never call ``policy.eval()`` or
``policy.train(False)`` on a policy itself (call them on its models).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import random
import threading
import time
from abc import ABC, abstractmethod
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
from tensordict import TensorDict
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from rlkube.envs.types import EnvRet, PolicyResponse
from rlkube.policy.updater import InInferenceMode, RolloutGate, WeightUpdater
from rlkube.policy.weight_source import StagedWeights, WeightSource
from rlkube.spec import BufferType, WeightStrategy

if TYPE_CHECKING:
    from rlkube.spec import PolicySpec, TrainSpec

logger = logging.getLogger(__name__)


class PolicyRole(StrEnum):
    TRAIN = "train"
    EVAL = "eval"


class RequestMode(StrEnum):
    """What one ``rollout_step`` call serves (a policy's class attribute ``request_mode``)."""

    PER_ENV = "per_env"  #: one env's EnvRet per call, as in RLightning (the default)
    BATCHED = "batched"  #: every env of the group in one call: [N, ...] rows in, one row per env out


def unwrap(model: nn.Module) -> nn.Module:
    """The module inside a DDP wrapper (or the module itself)."""
    return model.module if isinstance(model, DDP) else model


def clone_to_cpu(value: Any) -> Any:
    """Recursively detach and copy tensors to CPU (checkpoint payloads must not alias live weights)."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().clone()
    if isinstance(value, dict):
        return type(value)((k, clone_to_cpu(v)) for k, v in value.items())
    if isinstance(value, list | tuple):
        return type(value)(clone_to_cpu(v) for v in value)
    return value


def set_nested_attr(obj: Any, path: str, value: Any) -> None:
    parts = path.split(".")
    for part in parts[:-1]:
        obj = getattr(obj, part)
    setattr(obj, parts[-1], value)


class BasePolicy(nn.Module, ABC):
    """Abstract base of every policy; see the module docstring for the life cycle."""

    #: One env per ``rollout_step`` call (RLightning's model), or every env of the group at once.
    request_mode: ClassVar[RequestMode] = RequestMode.PER_ENV
    #: Passed to DDP by the default ``wrap_with_ddp`` (RLightning's default: True).
    ddp_find_unused_parameters: ClassVar[bool] = True
    #: The ``spec.buffer.type`` values this policy can learn from; a job asking for another one is
    #: refused before it starts (``rlkube validate``, ``rlkube run`` and the pods check it).
    supported_buffers: ClassVar[frozenset[BufferType]] = frozenset(BufferType)
    #: True: this policy's continuous (Box) actions always lie inside the action space's bounds, so
    #: the coordinator refuses fragments whose actions do not (``rlkube.data.spaces``). False (the
    #: default, and PPO's: Gaussian samples the env clips): only shape, dtype and finiteness.
    actions_within_bounds: ClassVar[bool] = False

    def __init__(self, config: PolicySpec, role_type: PolicyRole | str) -> None:
        super().__init__()
        self.config = config
        self.role_type = PolicyRole(role_type)
        self.device: str = f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cpu"
        self.model_list: list[tuple[str, nn.Module]] = []
        self.is_init = False
        self.ready = False
        self.rollout_mode: str = str(getattr(config.rollout_mode, "value", config.rollout_mode))
        self.weight_buffer_strategy: str = config.weight_buffer.strategy.value
        # eval side (rlkube.policy.updater)
        self._rollout_gate: RolloutGate | None = None
        self._weight_updater: WeightUpdater | None = None  # strategy None: none
        self._cycle_lock = threading.Lock()  # one stage-and-commit at a time (updater or caller)
        self._weight_source: WeightSource[BasePolicy] | None = None
        self.weight_version = -1
        self.update_block_seconds: list[float] = []  # time rollouts were gated per update
        self.last_update_error: str | None = None
        # train side
        self.dataset: Any = None
        self.world_size = 1
        self.timing_raw: dict[str, dict[str, Any]] = {}
        self.metrics: dict[str, float] = {}

    # ------------------------------------------------------------------ the eight user methods
    @abstractmethod
    def construct_network(self, env_meta: Any, *args: Any, **kwargs: Any) -> None:
        """Create the model(s) as attributes of ``self``; they are found and put in ``model_list``."""

    @abstractmethod
    def setup_optimizer(self, optim_cfg: Any) -> None:
        """Create the optimizer(s) (TRAIN only), e.g. ``self.optimizer = torch.optim.Adam(...)``."""

    @abstractmethod
    def rollout_step(self, env_ret: EnvRet, **kwargs: Any) -> PolicyResponse:
        """Inference for one env's request (or, with batched requests, every env's); may be ``async def``."""

    @abstractmethod
    def postprocess(self, env_ret: EnvRet | None = None, policy_resp: PolicyResponse | None = None) -> Any:
        """Called after each env step with that env's new EnvRet and its response; a dict is stored."""

    @abstractmethod
    def update_dataset(self, data: TensorDict) -> None:
        """Receive this rank's share of the epoch's trajectories (``self.dataset = data``)."""

    @abstractmethod
    def train(self, *args: Any, **kwargs: Any) -> Any:
        """One training epoch over ``self.dataset``; return or ``log_metric`` the figures."""

    def get_trainable_parameters(self) -> dict[str, dict[str, torch.Tensor]]:
        """``{module_name: state_dict}`` of every model in ``model_list`` (DDP unwrapped)."""
        return {name: unwrap(model).state_dict() for name, model in self.model_list}

    def load_state_dict(  # type: ignore[override]
        self, state_dict: dict[str, Any], strict: bool = True, assign: bool = False, *args: Any, **kwargs: Any
    ) -> None:
        """Load ``{module_name: state_dict}`` into the models of ``model_list``.

        With ``assign=True`` parameters are replaced by the given tensors (no copy): the weight
        plane uses this to point eval models at a shared-memory snapshot.
        """
        for name, model in self.model_list:
            if name not in state_dict:
                if strict:
                    raise KeyError(f"state dict has no entry for model {name!r} (has {sorted(state_dict)})")
                continue
            unwrap(model).load_state_dict(state_dict[name], strict=strict, assign=assign)

    # ------------------------------------------------------------------ framework: set-up
    def _find_model(self) -> None:
        """Fill ``model_list`` with every sub-module that has trainable parameters (unless set)."""
        if self.model_list:
            for name, model in self.model_list:
                if not isinstance(model, nn.Module):
                    raise ValueError(
                        f"model_list entry {name!r} is a {type(model).__name__}, not an nn.Module"
                    )
            return
        for name, module in self._modules.items():
            if module is not None and any(p.requires_grad for p in module.parameters()):
                self.model_list.append((name, module))
        if not self.model_list:
            logger.warning(
                "%s: construct_network created no module with trainable parameters", type(self).__name__
            )

    def attach_weight_source(self, source: WeightSource[BasePolicy] | None) -> None:
        """Called by the framework before ``init_eval``: where the updater thread reads weights."""
        self._weight_source = source

    def init_eval(self, eval_config: Any = None, env_meta: Any = None) -> None:
        """Build the networks for inference and start the updater thread (strategy != None)."""
        self.eval_config = eval_config
        self.construct_network(env_meta=env_meta)
        self._find_model()
        for _, model in self.model_list:
            model.eval()
            model.requires_grad_(False)
        self._rollout_gate = RolloutGate(self.rollout_mode)
        if self.config.weight_buffer.strategy is not WeightStrategy.NONE:  # None: sync() loads, no thread
            self._weight_updater = WeightUpdater(self.update_weights, name=f"{type(self).__name__}-updater")
            self._weight_updater.start()  # once set: the thread's update_weights() reads it
        self.is_init = True

    def init_train(self, train_config: TrainSpec | Any = None, env_meta: Any = None) -> None:
        """Build the networks for training, wrap them in DDP on several ranks, set up the optimizer."""
        self.train_config = train_config
        self.construct_network(env_meta=env_meta)
        self._find_model()
        for _, model in self.model_list:
            model.train()
        self.world_size = _dp_world_size()
        if self.world_size > 1:
            process_group = torch.distributed.group.WORLD
            torch.distributed.barrier()
            self.wrap_with_ddp(self.gpu_index(), process_group)
        self.setup_optimizer(self.config.optim_cfg)
        self.is_init = True

    def gpu_index(self) -> int:
        """The CUDA device index of ``self.device`` (0 on the CPU): what DDP's ``device_ids`` names.

        ``self.device`` is the current CUDA device when the policy is made; a train rank's entrypoint
        makes that ``cuda:LOCAL_RANK`` first (``rlkube.launch.devices``), so the model, its data and
        DDP all sit on the rank's own GPU.
        """
        device = torch.device(self.device)
        if device.type != "cuda":
            return 0
        return device.index if device.index is not None else torch.cuda.current_device()

    def wrap_with_ddp(self, gpu_id: int, process_group: Any) -> None:
        """Wrap every model of ``model_list`` in DDP; override to choose what is wrapped."""
        use_cuda = torch.cuda.is_available()
        wrapped: list[tuple[str, nn.Module]] = []
        for name, model in self.model_list:
            if isinstance(model, DDP):
                wrapped.append((name, model))
                continue
            unused = self.ddp_find_unused_parameters
            if use_cuda:
                ddp = DDP(
                    model.cuda(gpu_id),
                    device_ids=[gpu_id],
                    process_group=process_group,
                    find_unused_parameters=unused,
                )
            else:
                ddp = DDP(model, process_group=process_group, find_unused_parameters=unused)
            set_nested_attr(self, name, ddp)
            wrapped.append((name, ddp))
        self.model_list = wrapped

    def is_initialized(self) -> bool:
        return self.is_init

    def reset_training_state(self, train_config: Any, env_meta: Any = None, seed: int | None = None) -> None:
        """Rebuild models and optimizer from scratch (after a warm-up run)."""
        if seed is not None:
            seed_everything(seed)
        for name, _ in self.model_list:
            self._modules.pop(name.split(".")[0], None)
        self.model_list = []
        self.dataset = None
        for attr, value in list(vars(self).items()):
            if isinstance(value, torch.optim.Optimizer):
                setattr(self, attr, None)
        self.init_train(train_config, env_meta=env_meta)

    # ------------------------------------------------------------------ framework: rollout
    @torch.inference_mode()
    def _rollout(self, env_ret: EnvRet, **kwargs: Any) -> PolicyResponse:
        """Sync rollout under the idle gate (the updater commits only while the policy is idle)."""
        gate = self._rollout_gate.idle if self._rollout_gate is not None else None
        if gate is None:
            raise RuntimeError("_rollout needs init_eval() with rolloutMode sync (use _rollout_async)")
        with gate.hold():
            return self.rollout_step(env_ret.to(self.device), **kwargs)

    async def _rollout_async(self, env_ret: EnvRet, **kwargs: Any) -> PolicyResponse:
        """Async rollout behind the admission gate; in-flight requests are counted for the updater."""
        admission = self._rollout_gate.admission if self._rollout_gate is not None else None
        if admission is None:
            raise RuntimeError("_rollout_async needs init_eval() with rolloutMode async (use _rollout)")
        await admission.enter()
        try:
            with torch.inference_mode():
                result: Any = self.rollout_step(env_ret.to(self.device), **kwargs)
            if inspect.iscoroutine(result):
                result = await InInferenceMode(result)
            elif inspect.isawaitable(result):
                result = await result
            return result
        finally:
            admission.leave()

    @torch.inference_mode()
    def _postprocess(self, env_ret: EnvRet | None = None, policy_resp: PolicyResponse | None = None) -> Any:
        """``postprocess`` under the idle gate (sync mode); in async mode it is not gated."""
        gate = self._rollout_gate.idle if self._rollout_gate is not None else None
        if gate is None:
            return self.postprocess(env_ret, policy_resp)
        with gate.hold():
            return self.postprocess(env_ret, policy_resp)

    def check_idle(self) -> None:
        """Block until no rollout step or weight commit holds the gate (sync rollout mode only)."""
        assert self.rollout_mode == "sync", "check_idle is only supported in sync rollout mode"
        gate = self._rollout_gate.idle if self._rollout_gate is not None else None
        if self.role_type is PolicyRole.EVAL and gate is not None:
            gate.wait_idle()

    @property
    def event_loop(self) -> asyncio.AbstractEventLoop | None:
        """The loop async rollouts run on: the one running at ``init_eval``, else one made for them."""
        return self._rollout_gate.loop if self._rollout_gate is not None else None

    @property
    def num_requests(self) -> int:
        """Async rollout requests admitted and not yet finished."""
        return self._rollout_gate.in_flight if self._rollout_gate is not None else 0

    def get_num_requests(self) -> int:
        return self.num_requests

    # ------------------------------------------------------------------ framework: weights
    def notify_update_weights(self) -> None:
        """Tell the updater thread that a newer snapshot exists (no-op for strategy None)."""
        if self._weight_updater is not None:
            self._weight_updater.notify()

    def wait_for_weight_update_done(self, timeout: float | None = None) -> bool:
        """Block until the updater finished its latest cycle; True also when there is no updater."""
        if self._weight_updater is None:
            return True
        return self._weight_updater.wait_done(timeout=timeout)

    def update_weights(self) -> None:
        """The updater thread: stage outside the gate, commit inside it, forever (until closed)."""
        assert self._weight_updater is not None
        self._weight_updater.run(self.update_weights_now)

    def update_weights_now(self) -> int | None:
        """Load the newest snapshot in the calling thread; for callers between rollouts.

        An eval worker that must hold a version before its next task loads it itself instead of
        waking the updater thread and waiting for it (thread hand-offs cost milliseconds on a busy
        node). The updater's cycle and this one never overlap. A failed load is logged (once per
        distinct error) and kept in ``last_update_error``; the model keeps what it holds, and the
        caller or the updater thread carries on: the next version may load fine.
        """
        with self._cycle_lock:
            try:
                version = self.update_weights_from_buffer()
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
                if error != self.last_update_error:
                    logger.exception("weight update failed; keeping version %d", self.weight_version)
                self.last_update_error = error
                return None
            self.last_update_error = None
            return version

    def update_weights_from_buffer(self) -> int | None:
        """Load the newest snapshot from the weight source; returns its version or None if none is newer."""
        if self._weight_source is None:
            return None
        staged = self._weight_source.stage(self)
        if staged is None:
            return None
        self.commit_staged_weights(staged)
        return staged.version

    def commit_staged_weights(self, staged: StagedWeights) -> None:
        """Swap ``staged`` in under the rollout gate and record how long rollouts were blocked.

        Blocked time runs from the moment the gate closes to rollouts (sync: once the step in
        flight has finished; async: when admission stops, so draining admitted requests counts)
        until just before it reopens (a woken rollout may take the GIL first). The source's
        optional ``after_commit(policy, staged)`` runs once rollouts are free again (e.g. to
        release the previous snapshot).
        """
        source = self._weight_source
        assert source is not None
        closed = time.perf_counter()
        self._pre_update_weights_hook()
        if self._rollout_gate is not None and self._rollout_gate.idle is not None:
            closed = time.perf_counter()
        try:
            source.commit(self, staged)
            self.weight_version = staged.version
        finally:
            blocked = time.perf_counter() - closed
            self._post_update_weights_hook()
            self.update_block_seconds.append(blocked)
            if len(self.update_block_seconds) > 10_000:
                del self.update_block_seconds[:5_000]
        after_commit = getattr(source, "after_commit", None)
        if after_commit is not None:
            after_commit(self, staged)

    def _pre_update_weights_hook(self) -> None:
        """Enter the rollout gate: wait for the step in flight (sync) or drain admitted requests (async)."""
        if self._rollout_gate is not None:
            self._rollout_gate.close_for_commit()

    def _post_update_weights_hook(self) -> None:
        if self._rollout_gate is not None:
            self._rollout_gate.reopen()

    def get_param_fingerprint(self) -> dict[str, float]:
        """Per-parameter float32 L2 norms, ``"<module>.<param>" -> norm``; cheap to compare across pods."""
        fingerprint: dict[str, float] = {}
        for module_name, model in self.model_list:
            for param_name, param in unwrap(model).named_parameters():
                fingerprint[f"{module_name}.{param_name}"] = float(param.detach().float().norm().item())
        return fingerprint

    def close(self) -> None:
        """Stop the updater thread and release the weight source."""
        if self._weight_updater is not None:
            self._weight_updater.stop()
        if self._weight_source is not None:
            self._weight_source.close()
        if self._rollout_gate is not None:
            self._rollout_gate.close()

    # ------------------------------------------------------------------ framework: checkpoints
    def save_checkpoint(self, path: str | os.PathLike[str]) -> None:
        """Save the models of ``model_list`` (DDP unwrapped, copied to CPU); override for more."""
        self.save_models(path)

    def load_checkpoint(self, path: str | os.PathLike[str]) -> None:
        """Inverse of the default ``save_checkpoint``."""
        self.load_models(path)

    def save_models(self, path: str | os.PathLike[str]) -> None:
        """The framework's own copy of ``model_list``: ``{name: state_dict}`` (DDP unwrapped, on CPU)."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        state = {name: clone_to_cpu(unwrap(model).state_dict()) for name, model in self.model_list}
        torch.save(state, target)

    def load_models(self, path: str | os.PathLike[str]) -> None:
        """Load a file written by :meth:`save_models`; a missing model is named, with the fix."""
        state = torch.load(Path(path), map_location="cpu", weights_only=True)
        if not isinstance(state, dict):
            state = {}
        missing = [name for name, _ in self.model_list if name not in state]
        if missing:
            hint = (
                f" ({type(self).__name__} overrides save_checkpoint: "
                "define load_checkpoint to read what it writes)"
                if self.saves_custom_checkpoints()
                else ""
            )
            raise ValueError(
                f"{path}: no state for model(s) {', '.join(map(repr, missing))} "
                f"(the file has {sorted(map(str, state))}){hint}"
            )
        for name, model in self.model_list:
            unwrap(model).load_state_dict(state[name])

    @classmethod
    def saves_custom_checkpoints(cls) -> bool:
        """True when the class overrides ``save_checkpoint`` but not ``load_checkpoint``.

        The default loader cannot know what such a ``save_checkpoint`` wrote, so checkpoints of these
        policies also hold :meth:`save_models`'s copy and resume from it.
        """
        return (
            cls.save_checkpoint is not BasePolicy.save_checkpoint
            and cls.load_checkpoint is BasePolicy.load_checkpoint
        )

    def optimizers(self) -> dict[str, Any]:
        """Attributes holding optimizers or LR schedulers, by name (checkpointed by the engine)."""
        found: dict[str, Any] = {}
        for attr, value in vars(self).items():
            if isinstance(value, torch.optim.Optimizer | torch.optim.lr_scheduler.LRScheduler):
                found[attr] = value
        return found

    def replay_sample_size(self, steps_per_epoch: int, world_size: int) -> int:
        """``buffer.type: replay``: transitions this rank samples from its ring for one ``update_dataset``.

        The default is this rank's share of ``stepsPerEpoch``; an off-policy learner that takes
        many gradient steps per epoch (the built-in SAC) asks for one minibatch per step.
        """
        return steps_per_epoch // world_size

    # ------------------------------------------------------------------ framework: metrics
    def log_metric(self, key: str, value: float) -> None:
        """Record a scalar for this epoch (e.g. ``losses/policy_loss``); the engine logs and clears them."""
        self.metrics[key] = float(value)

    def pop_metrics(self) -> dict[str, float]:
        metrics, self.metrics = self.metrics, {}
        return metrics

    def print_timing_summary(self, reset: bool = False) -> None:
        for name, stats in dict(self.timing_raw).items():
            logger.debug("%-28s count=%s total=%.6fs", name, stats.get("count"), stats.get("total", 0.0))
        if reset:
            self.timing_raw = {}


def _dp_world_size() -> int:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size()
    return 1


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
