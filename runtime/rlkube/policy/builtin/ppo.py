"""The built-in ``PPO`` policy (``spec.policy.type: PPO``): CleanRL's PPO on rlkube's BasePolicy.

PPO declares batched requests (``request_mode = RequestMode.BATCHED``): ``rollout_step`` gets every
env of the group in one call. ``update_dataset`` receives this rank's ``[rows, T]`` share of the
epoch's fragments, recomputes
V(observation) and V(next_observation) with the current critic and computes GAE per row (see
``ppo_math``). ``train`` runs ``updateEpochs`` passes of shuffled minibatches. ``spec.train.batchSize``
is the *global* minibatch: with W DDP ranks each rank takes ``batchSize // W`` rows from its own
share, so every rank takes the same number of optimizer steps (ranks hold equal-sized shares) and
the job's hyperparameters do not depend on how many ranks it runs on.

Metrics (``log_metric``): ``losses/policy_loss``, ``losses/value_loss``, ``losses/entropy``,
``losses/approx_kl``, ``losses/clipfrac`` (minibatch means over the update), ``losses/explained_variance``
(values at collection vs returns), ``charts/learning_rate`` (the rate used this update),
``charts/update_epochs`` (passes run; fewer when ``targetKl`` stopped them).

With ``modelCfg.normalizeObservation`` the running observation statistics are buffers of the
model: ``train`` merges the raw observations of the batch it trained on into them after the
update (over all DDP ranks), so version v+1 carries them to every eval worker and checkpoint,
and each batch is trained with the statistics it was collected with. The trainer, not the
workers, owns them because it sees every trained transition exactly once, between versions, in
one place: no merge protocol between workers, and no worker's view can drift from another's.
With ``modelCfg.observationStats: perStep`` (Stable-Baselines3's ``VecNormalize``) the acting
policy also merges each observation into its copy before acting on it and ships the normalised
observation (``NORMALIZED_OBSERVATION``); the trainer trains on those as collected and merges the
same raw batch in ``update_dataset``, which gives the statistics the worker ended its rollout with
(the merge is exact whatever the batching), so version v+1 starts from them.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from tensordict import TensorDict
from torch import nn

from rlkube.data.fragment import (
    NEXT_OBSERVATION,
    OBSERVATION,
    POLICY_LAG,
    REWARD,
    TERMINATED,
    TRUNCATED,
)
from rlkube.envs.types import EnvRet, PolicyResponse
from rlkube.policy.base import BasePolicy, PolicyRole, RequestMode, unwrap
from rlkube.policy.builtin.actor_critic import ActorCritic
from rlkube.policy.builtin.ppo_config import PPOAlgoConfig, PPOModelConfig, PPOOptimConfig, parse_section
from rlkube.policy.builtin.ppo_math import clipped_surrogate, explained_variance, gae, normalize, value_loss
from rlkube.policy.builtin.ppo_vtrace import correct_stale_rows
from rlkube.policy.builtin.running_stats import RunningObsNorm
from rlkube.policy.registry import POLICIES
from rlkube.spec import BufferType, VtraceClipAnchor

#: The fragment field of ``observationStats: perStep``: the observation as the acting policy
#: normalised it (statistics merged up to and including it).
NORMALIZED_OBSERVATION = "normalized_observation"


@POLICIES.register("PPO")
class PPO(BasePolicy):
    """Clipped-surrogate PPO with an MLP actor-critic; see the module docstring."""

    #: PPO's rollout_step is written for every env of the group at once (rlkube's fast path).
    request_mode = RequestMode.BATCHED
    #: Every step uses the actor and the critic: DDP needs no search for unused parameters.
    ddp_find_unused_parameters = False
    #: On-policy: it learns from each epoch's fresh rollouts (GAE over whole fragments), not a replay ring.
    supported_buffers = frozenset({BufferType.ROLLOUT})

    def __init__(self, config: Any, role_type: PolicyRole | str) -> None:
        super().__init__(config, role_type)
        self.algo = parse_section(PPOAlgoConfig, config.algo_cfg, path="spec.policy.algoCfg")
        self.optim_settings = parse_section(PPOOptimConfig, config.optim_cfg, path="spec.policy.optimCfg")
        self.arch = parse_section(PPOModelConfig, config.model_cfg, path="spec.policy.modelCfg")
        self.optimizer: torch.optim.Optimizer | None = None
        self.lr_scheduler: torch.optim.lr_scheduler.LRScheduler | None = None
        #: Whether ``self.dataset["obs"]`` holds observations normalised at collection (perStep).
        self._dataset_normalized = False
        #: perStep, acting: (weight version, this worker's own copy of that version's statistics).
        self._step_stats: tuple[int, RunningObsNorm] | None = None

    # ------------------------------------------------------------------ network and optimizer
    def construct_network(self, env_meta: Any, *args: Any, **kwargs: Any) -> None:
        self.model = ActorCritic(
            env_meta.observation_space,
            env_meta.action_space,
            hidden_sizes=self.arch.hidden_sizes,
            activation=self.arch.activation,
            init_log_std=self.arch.init_log_std,
            ortho_init=self.arch.ortho_init,
            encoder=self.arch.encoder,
            image_layout=self.arch.image_layout,
            normalize_observation=self.arch.normalize_observation,
            observation_clip=self.arch.observation_clip,
        ).to(self.device)

    def setup_optimizer(self, optim_cfg: Any) -> None:
        settings = self.optim_settings
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=settings.lr, eps=settings.eps)
        max_epochs = getattr(getattr(self, "train_config", None), "max_epochs", None)
        if settings.anneal_lr and max_epochs:
            total = float(max_epochs)
            self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(
                self.optimizer, lambda epoch: max(0.0, 1.0 - epoch / total)
            )

    # ------------------------------------------------------------------ rollout (EVAL)
    def rollout_step(self, env_ret: EnvRet, deterministic: bool = False, **kwargs: Any) -> PolicyResponse:
        obs_norm = cast(ActorCritic, unwrap(self.model)).obs_norm
        if self.arch.observation_stats == "perStep" and obs_norm is not None and not deterministic:
            return self._rollout_step_per_step_stats(env_ret, obs_norm)
        action, log_prob, _, value = self.model(env_ret.observation, deterministic=deterministic)
        return PolicyResponse(env_id=env_ret.env_id, action=action, log_prob=log_prob, value=value)

    @torch.no_grad()
    def _rollout_step_per_step_stats(self, env_ret: EnvRet, obs_norm: RunningObsNorm) -> PolicyResponse:
        """Merge the observations, normalise them with the result, act; the fragment keeps them.

        The moving statistics are this worker's own copy of its version's, started afresh at each
        new version: the model's buffers stay the version's (they may be a shared-memory snapshot
        other workers read, and the fingerprint checks them). Greedy (evaluation) steps do not
        move them, as ``VecNormalize(training=False)``.
        """
        if self._step_stats is None or self._step_stats[0] != self.weight_version:
            own = RunningObsNorm(obs_norm.mean.numel(), clip=obs_norm.clip, epsilon=obs_norm.epsilon)
            own.load_state_dict(obs_norm.state_dict())  # a copy
            self._step_stats = (self.weight_version, own.to(obs_norm.mean.device))
        moving = self._step_stats[1]
        raw = env_ret.observation.reshape(env_ret.observation.shape[0], -1)
        moving.update_(raw)
        normalized = moving(raw)
        action, log_prob, _, value = self.model(normalized, normalized=True)
        return PolicyResponse(
            env_id=env_ret.env_id,
            action=action,
            log_prob=log_prob,
            value=value,
            **{NORMALIZED_OBSERVATION: normalized},
        )

    def postprocess(self, env_ret: EnvRet | None = None, policy_resp: PolicyResponse | None = None) -> Any:
        return None

    # ------------------------------------------------------------------ training (TRAIN)
    @torch.no_grad()
    def update_dataset(self, data: TensorDict) -> None:
        """GAE over this rank's ``[rows, T]`` share with the current critic, then flatten to ``b_``."""
        data = data.to(self.device)
        model = cast(ActorCritic, unwrap(self.model))
        rows, steps = data.batch_size
        flat_obs = data[OBSERVATION].reshape(rows * steps, *data[OBSERVATION].shape[2:])
        flat_next = data[NEXT_OBSERVATION].reshape(rows * steps, *data[NEXT_OBSERVATION].shape[2:])
        self._dataset_normalized = NORMALIZED_OBSERVATION in data
        if self._dataset_normalized:
            if POLICY_LAG in data:
                raise ValueError(
                    "modelCfg.observationStats perStep works with the sync engine (V-trace re-evaluates "
                    "stale rows with the current statistics)"
                )
            flat_obs, flat_next = self._normalized_as_collected(data, flat_obs, flat_next)
        values = model.value(flat_obs, normalized=self._dataset_normalized).reshape(rows, steps)
        next_values = model.value(flat_next, normalized=self._dataset_normalized).reshape(rows, steps)
        advantages, returns = gae(
            data[REWARD],
            values,
            next_values,
            data[TERMINATED].bool(),
            data[TRUNCATED].bool(),
            gamma=self.algo.gamma,
            gae_lambda=self.algo.gae_lambda,
        )
        anchor_log_prob = data["log_prob"].float()  # what the clipped ratio is taken against
        if POLICY_LAG in data:  # async engine, staleFragments vtrace: see ppo_vtrace
            advantages, returns, anchor_log_prob = self._correct_stale(
                data, values, next_values, advantages, returns
            )
        self.dataset = TensorDict(
            {
                "obs": flat_obs,
                "actions": data["action"].reshape(rows * steps, *data["action"].shape[2:]),
                "logprobs": anchor_log_prob.reshape(-1),
                "advantages": advantages.reshape(-1),
                "returns": returns.reshape(-1),
                "values": values.reshape(-1),
            },
            batch_size=[rows * steps],
            device=self.device,
        )

    def _normalized_as_collected(
        self, data: TensorDict, flat_raw: torch.Tensor, flat_next: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """perStep: the observations as the worker normalised them, and next observations to match.

        The raw batch is merged into the statistics first: they then equal the worker's at the
        end of its rollout (version v+1 carries them). A next observation is the next step's
        normalised observation where the episode goes on; where it ended (the final frame) or
        at the fragment's end, it is normalised with those end-of-rollout statistics, as
        ``VecNormalize`` normalises a terminal observation and the last one.
        """
        obs_norm = cast(ActorCritic, unwrap(self.model)).obs_norm
        assert obs_norm is not None
        obs_norm.update_(flat_raw, world_size=self.world_size)
        rows, steps = data.batch_size
        normalized = data[NORMALIZED_OBSERVATION].float()
        next_normalized = obs_norm(flat_next.reshape(rows * steps, -1)).reshape(normalized.shape).clone()
        ended = (data[TERMINATED] | data[TRUNCATED]).bool()
        goes_on = ~ended[:, :-1]
        next_normalized[:, :-1][goes_on] = normalized[:, 1:][goes_on]
        return normalized.reshape(rows * steps, -1), next_normalized.reshape(rows * steps, -1)

    def _correct_stale(
        self,
        data: TensorDict,
        values: torch.Tensor,
        next_values: torch.Tensor,
        advantages: torch.Tensor,
        returns: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        train = getattr(self, "train_config", None)
        corrected = correct_stale_rows(
            cast(ActorCritic, unwrap(self.model)),
            data,
            values=values,
            next_values=next_values,
            advantages=advantages,
            returns=returns,
            gamma=self.algo.gamma,
            gae_lambda=self.algo.gae_lambda,
            rho_bar=float(getattr(train, "vtrace_rho_clip", 1.0)),
            c_bar=float(getattr(train, "vtrace_c_clip", 1.0)),
            anchor=VtraceClipAnchor(getattr(train, "vtrace_clip_anchor", VtraceClipAnchor.LEARNER)),
        )
        self.log_metric("charts/vtrace_rows", float(corrected.stale_rows))
        if corrected.mean_clipped_rho is not None:
            self.log_metric("charts/vtrace_mean_clipped_rho", corrected.mean_clipped_rho)
        return corrected.advantages, corrected.returns, corrected.anchor_log_prob

    def minibatch_size(self) -> int:
        """This rank's minibatch: the global ``spec.train.batchSize`` split over the ranks."""
        global_batch = getattr(getattr(self, "train_config", None), "batch_size", None)
        size = len(self.dataset) if global_batch is None else max(1, int(global_batch) // self.world_size)
        return min(size, len(self.dataset))

    def train(self, *args: Any, **kwargs: Any) -> dict[str, float]:  # type: ignore[override]  # RLightning's train()
        if self.dataset is None or self.optimizer is None:
            raise RuntimeError("PPO.train needs init_train() and update_dataset() first")
        b = self.dataset
        batch = len(b)
        mb_size = self.minibatch_size()
        params = [p for p in self.model.parameters() if p.requires_grad]
        lr = float(self.optimizer.param_groups[0]["lr"])
        names = ("policy_loss", "value_loss", "entropy", "approx_kl", "clipfrac")
        # Every tensor made here names the learner's device: a tensor left on the default device
        # (CPU) mixes with the model's outputs on a GPU. Summed on device: no sync per step.
        device = torch.device(self.device)
        sums = {name: torch.zeros((), device=device) for name in names}
        steps = 0
        epochs_run = 0
        for _ in range(self.algo.update_epochs):
            epochs_run += 1
            order = torch.randperm(batch, device=device)
            epoch_kl = torch.zeros((), device=device)
            epoch_steps = 0
            for start in range(0, batch - mb_size + 1, mb_size):  # whole minibatches: equal steps per rank
                mb = b[order[start : start + mb_size]]
                _, new_log_prob, entropy, new_value = self.model(
                    mb["obs"], mb["actions"], normalized=self._dataset_normalized
                )
                mb_advantages = normalize(mb["advantages"]) if self.algo.norm_adv else mb["advantages"]
                surrogate = clipped_surrogate(
                    new_log_prob, mb["logprobs"], mb_advantages, clip_coef=self.algo.clip_coef
                )
                v_loss = value_loss(
                    new_value,
                    mb["values"],
                    mb["returns"],
                    clip_coef=self.algo.clip_coef,
                    clip=self.algo.clip_vloss,
                    form=self.algo.clip_vloss_form,
                )
                entropy_loss = entropy.mean()
                loss = surrogate.loss - self.algo.ent_coef * entropy_loss + self.algo.vf_coef * v_loss
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                if self.optim_settings.max_grad_norm is not None:
                    nn.utils.clip_grad_norm_(params, self.optim_settings.max_grad_norm)
                self.optimizer.step()
                steps += 1
                epoch_steps += 1
                epoch_kl += surrogate.approx_kl
                for name, value in zip(
                    names,
                    (surrogate.loss, v_loss, entropy_loss, surrogate.approx_kl, surrogate.clipfrac),
                    strict=True,
                ):
                    sums[name] += value.detach()
            target_kl = self.algo.target_kl
            if (
                target_kl is not None
                and epoch_steps
                and self._mean_over_ranks(epoch_kl / epoch_steps) > target_kl
            ):
                break
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()
        # The batch was collected and trained with version v's statistics (ratio 1 at the start);
        # its raw observations now move them, and version v+1 carries the result.
        # (perStep merged them in update_dataset, before computing GAE.)
        obs_norm = cast(ActorCritic, unwrap(self.model)).obs_norm
        if obs_norm is not None and not self._dataset_normalized:
            obs_norm.update_(b["obs"], world_size=self.world_size)
        metrics = {f"losses/{key}": float(value) / max(steps, 1) for key, value in sums.items()}
        metrics["losses/explained_variance"] = explained_variance(b["values"], b["returns"])
        metrics["charts/learning_rate"] = lr
        metrics["charts/update_epochs"] = float(epochs_run)
        for key, value in metrics.items():
            self.log_metric(key, value)
        return metrics

    def get_param_fingerprint(self) -> dict[str, float]:
        """Parameter norms plus the observation statistics' (they are part of every version too)."""
        fingerprint = super().get_param_fingerprint()
        for module_name, model in self.model_list:
            for name, buffer in unwrap(model).named_buffers():
                if buffer.is_floating_point():
                    fingerprint[f"{module_name}.{name}"] = float(buffer.detach().double().norm().item())
        return fingerprint

    def _mean_over_ranks(self, value: torch.Tensor) -> float:
        """The same number on every rank (an early stop must be taken by all ranks or DDP hangs)."""
        if self.world_size > 1 and torch.distributed.is_initialized():
            value = value.detach().clone()
            torch.distributed.all_reduce(value)
            value /= self.world_size
        return float(value)
