"""``spec.env`` translated into the options of an envpool env, or refused naming the field.

Pure: no I/O. The caller passes the envpool task's option names (``envpool.make_spec(id).config``);
:func:`envpool_options` says which envpool task runs ``spec.env.id`` and with what options, so
that the job means what it means with ``vectorization: sync``:

* ``spec.env.id`` may be envpool's id (``Breakout-v5``) or the gymnasium one (``ALE/Breakout-v5``,
  the ``ALE/`` prefix is dropped).
* Atari ``spec.env.kwargs`` keep their ``gymnasium.make`` meaning, with ALE v5's defaults (sticky
  actions 0.25, which envpool's own default of 0.0 would silently drop). With
  ``AtariPreprocessing`` the raw env must not skip frames itself (``frameskip: 1``), as gymnasium
  requires.
* Every wrapper maps to envpool's native option, or the job is refused with the wrapper's index
  and type: envpool runs each env in C++ threads, there is no Python env to wrap.

========================  =====================================  ==========================================
wrapper                   envpool option                         refused when
========================  =====================================  ==========================================
``AtariPreprocessing``    ``noop_max``, ``frame_skip``,          not first; ``grayscaleObs: false`` (envpool
                          ``img_height``/``img_width``           folds RGB into channels); ``terminalOnLife
                                                                 Loss: true`` (envpool never resets a game
                                                                 at a lost life: use ``EpisodicLife``)
``EpisodicLife``          ``episodic_life``                      not an Atari env
``FireReset``             ``use_fire_reset``                     not an Atari env
``ClipReward``            ``reward_clip``                        ``sign: false``, or not an Atari env
``FrameStack``            ``stack_num``                          not an Atari env
``TimeLimit``             ``max_episode_steps``                  inside ``AtariPreprocessing`` (it would
                                                                 count frames, envpool counts agent steps)
``ClipAction``            (the group clips actions to the space  never
                          anyway: ``EnvGroup(clip_actions)``)
anything else             none                                   always
========================  =====================================  ==========================================

An Atari env on envpool always preprocesses (max-pool, resize), so it needs ``AtariPreprocessing``.
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rlkube import spec as S

if TYPE_CHECKING:
    from rlkube.spec import WrapperSpec

BACKEND = "envpool"

#: ``gymnasium.make("ALE/<Game>-v5")``'s defaults (ale_py's registration; a test keeps them equal).
ALE_V5_DEFAULTS: Mapping[str, Any] = {
    "repeat_action_probability": 0.25,
    "full_action_space": False,
    "frameskip": 4,
    "max_num_frames_per_episode": 108_000,
}

#: Options the group itself sets (one per env seed, a synchronous batch of every env).
RESERVED = frozenset(
    {"num_envs", "batch_size", "seed", "env_seed", "gym_reset_return_info", "max_num_players", "base_path"}
)

#: Atari options that ``spec.env.wrappers`` set (so a kwarg cannot contradict a wrapper).
ATARI_WRAPPER_OPTIONS = frozenset(
    {
        "noop_max",
        "frame_skip",
        "img_height",
        "img_width",
        "gray_scale",
        "episodic_life",
        "use_fire_reset",
        "reward_clip",
        "stack_num",
        "max_episode_steps",
    }
)

#: ALE ``gymnasium.make`` kwargs envpool takes under the same name.
ALE_PASSTHROUGH = frozenset({"repeat_action_probability", "full_action_space", "mode", "difficulty"})


@dataclass(frozen=True)
class EnvpoolOptions:
    """What to make: ``envpool.make_gymnasium(task_id, num_envs=..., env_seed=..., **options)``."""

    task_id: str
    options: dict[str, Any] = field(default_factory=dict)
    is_atari: bool = False
    #: Raw frames per agent step (Atari): episode lengths are reported in raw env steps, as the
    #: gymnasium backend counts them inside ``AtariPreprocessing``.
    frames_per_step: int = 1
    #: envpool gives an Atari frame without ``FrameStack`` a leading axis of 1; gymnasium does not.
    drop_stack_axis: bool = False


def envpool_task_id(env_id: str) -> str:
    """envpool's id for ``spec.env.id``: gymnasium's ``ALE/`` namespace dropped."""
    return env_id.removeprefix("ALE/")


def unknown_id_message(env_id: str, known: Collection[str]) -> str:
    """The refusal of an id envpool does not have, with the nearest ones it does."""
    task = envpool_task_id(env_id)
    near = difflib.get_close_matches(task, list(known), n=5, cutoff=0.75)
    hint = f"; envpool has {', '.join(near)}" if near else ""
    return (
        f"spec.env.id: got {env_id!r}, which the {BACKEND} backend (spec.env.vectorization: {BACKEND}) "
        f"does not have{hint} (envpool.list_all_envs() lists them; vectorization sync or async runs "
        "any gymnasium id)"
    )


def _refuse(index: int, wrapper: WrapperSpec, why: str) -> ValueError:
    return ValueError(f"spec.env.wrappers[{index}] ({wrapper.type}): the {BACKEND} backend {why}")


def envpool_options(
    env_id: str,
    *,
    kwargs: Mapping[str, Any],
    wrappers: Sequence[WrapperSpec],
    config_keys: Collection[str],
) -> EnvpoolOptions:
    """Map ``spec.env`` onto envpool's options (see the module docstring); ValueError names the field."""
    task_id = envpool_task_id(env_id)
    is_atari = "episodic_life" in config_keys and "stack_num" in config_keys
    options: dict[str, Any] = {}
    if is_atari:
        options.update(stack_num=1, use_fire_reset=False, episodic_life=False, reward_clip=False)
    seen: set[str] = set()
    preprocessing: S.AtariPreprocessingWrapper | None = None
    time_limit: int | None = None
    for index, wrapper in enumerate(wrappers):
        if wrapper.type in seen:
            raise _refuse(index, wrapper, "applies each wrapper at most once")
        seen.add(wrapper.type)
        if isinstance(wrapper, S.ClipActionWrapper):
            continue
        if isinstance(wrapper, S.TimeLimitWrapper):
            if is_atari and preprocessing is None:
                raise _refuse(index, wrapper, "counts agent steps: put TimeLimit after AtariPreprocessing")
            time_limit = wrapper.max_episode_steps
            continue
        atari_only = (
            S.AtariPreprocessingWrapper,
            S.EpisodicLifeWrapper,
            S.FireResetWrapper,
            S.ClipRewardWrapper,
            S.FrameStackWrapper,
        )
        if not isinstance(wrapper, atari_only):
            raise _refuse(
                index, wrapper, "has no native option for it; use spec.env.vectorization sync or async"
            )
        if not is_atari:
            raise _refuse(
                index, wrapper, f"does it for Atari envs only, not {task_id}; use vectorization sync or async"
            )
        if isinstance(wrapper, S.AtariPreprocessingWrapper):
            if index != 0:
                raise _refuse(index, wrapper, "preprocesses the raw frames: it must be spec.env.wrappers[0]")
            if not wrapper.grayscale_obs:
                raise _refuse(
                    index,
                    wrapper,
                    "gives RGB frames folded into channels, not gymnasium's HWC: set grayscaleObs: true "
                    "or use vectorization sync or async",
                )
            if wrapper.terminal_on_life_loss:
                raise _refuse(
                    index,
                    wrapper,
                    "never resets the game at a lost life: use an EpisodicLife wrapper instead of "
                    "terminalOnLifeLoss: true",
                )
            preprocessing = wrapper
            options.update(
                noop_max=wrapper.noop_max,
                frame_skip=wrapper.frame_skip,
                img_height=wrapper.screen_size,
                img_width=wrapper.screen_size,
                gray_scale=True,
            )
        elif preprocessing is None:
            raise _refuse(index, wrapper, "applies it to preprocessed frames: put AtariPreprocessing first")
        elif isinstance(wrapper, S.EpisodicLifeWrapper):
            options["episodic_life"] = True
        elif isinstance(wrapper, S.FireResetWrapper):
            options["use_fire_reset"] = True
        elif isinstance(wrapper, S.ClipRewardWrapper):
            if not wrapper.sign:
                raise _refuse(index, wrapper, "clips rewards by their sign only: set sign: true")
            options["reward_clip"] = True
        elif isinstance(wrapper, S.FrameStackWrapper):
            options["stack_num"] = wrapper.stack_size
    if is_atari and preprocessing is None:
        raise ValueError(
            f"spec.env.wrappers: the {BACKEND} backend always preprocesses Atari frames (max-pool, "
            "resize), so spec.env.wrappers[0] must be an AtariPreprocessing wrapper (its settings map "
            "to envpool's); use vectorization sync or async for raw frames"
        )
    frames_per_step = preprocessing.frame_skip if preprocessing is not None else 1
    options.update(_kwargs_options(task_id, kwargs, config_keys, is_atari, frames_per_step))
    if time_limit is not None:
        options["max_episode_steps"] = time_limit
    return EnvpoolOptions(
        task_id=task_id,
        options=options,
        is_atari=is_atari,
        frames_per_step=frames_per_step,
        drop_stack_axis=is_atari and options["stack_num"] == 1,
    )


def _kwargs_options(
    task_id: str, kwargs: Mapping[str, Any], config_keys: Collection[str], is_atari: bool, frame_skip: int
) -> dict[str, Any]:
    options: dict[str, Any] = {}
    given = dict(kwargs)
    if is_atari:
        ale = {**ALE_V5_DEFAULTS, **given}
        if ale["frameskip"] != 1:
            raise ValueError(
                f"spec.env.kwargs.frameskip: got {ale['frameskip']!r} (ALE v5's default is 4); "
                "AtariPreprocessing skips frames itself, so the raw env needs frameskip: 1"
            )
        options["max_episode_steps"] = int(ale["max_num_frames_per_episode"]) // frame_skip
        for key in ALE_PASSTHROUGH:
            if key in ale:
                options[key] = ale[key]
        given = {k: v for k, v in given.items() if k not in ALE_V5_DEFAULTS and k not in ALE_PASSTHROUGH}
    for key, value in given.items():
        if key in RESERVED:
            raise ValueError(f"spec.env.kwargs.{key}: the group sets it (spec.env.numEnvs, train.seed)")
        if is_atari and key in ATARI_WRAPPER_OPTIONS:
            raise ValueError(
                f"spec.env.kwargs.{key}: spec.env.wrappers set it on the {BACKEND} backend "
                "(AtariPreprocessing, EpisodicLife, FireReset, ClipReward, FrameStack, TimeLimit)"
            )
        if key not in config_keys:
            names = ", ".join(sorted(k for k in config_keys if k not in RESERVED))
            raise ValueError(
                f"spec.env.kwargs.{key}: {BACKEND}'s {task_id} has no such option (its options: {names})"
            )
        options[key] = value
    return options
