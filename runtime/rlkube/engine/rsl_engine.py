"""The RSL engine (RLightning's RSLRLEngine, over pods): the sync loop with RSL-RL's rollout contract.

I/O (runs on train rank 0). RLightning's RSLRLEngine is its SyncRLEngine with three changes, and
rlkube's sync loop already holds each of them, so this engine *is* :class:`SyncEngine` (one
implementation) under the name RSL-RL users look for:

* rollouts of a fixed horizon that continue across iterations without resetting the envs: a
  fragment is ``train.fragmentLength`` steps of every env of an eval replica, and an eval
  worker's envs keep running from one fragment to the next (only its first ``collect`` resets);
* ``postprocess`` after every rollout step (``rlkube.engine.rollout``), its dict stored per step;
* training on the whole collected batch (RLightning's ``batch_size: -1``): each rank's
  ``update_dataset`` gets its whole ``[rows, fragmentLength]`` share of the epoch, and an RSL-RL
  policy (``RSLRLPolicy``) mini-batches it itself, so ``train.batchSize`` does not apply to it.

What it adds is the check that the job is one RSL-RL training can run: an on-policy (rollout)
buffer (a spec rule, ``spec.engine``).
"""

from __future__ import annotations

from rlkube.engine.sync_engine import SyncEngine


class RSLEngine(SyncEngine):
    """``engine: rsl``; see the module docstring."""
