"""``rlkube bench learn JOB``: learning curves of a reference job, rlkube's PPO or SAC beside SB3's.

For each seed, in one process run and interleaved (the order of the sides rotates by one per
seed, so load drift on a shared machine hits every side alike): the job runs for ``--steps`` env
steps (``maxEpochs`` is set from it; eval episodes off) in-process (``--mode in-process``, side
``rlkube``), as a local cluster like ``rlkube run`` starts it (``--mode cluster``, side
``rlkube-cluster``: ``trainer.replicas`` train ranks and ``--evaluators`` eval workers as
processes), or both (``--mode both``); and SB3's PPO (SAC for a ``policy.type: SAC`` job) runs with
the same hyperparameters, envs, wrappers and budget (``benchmarks/learn/sb3_peer.py`` and
``sac_peer.py`` have the mappings). Every side records *raw*
episode returns, stamped with the env steps collected at the end of the update they finished in.

Printed: the learning curve (median over seeds of the 20-episode mean return at tenths of the
budget), final return mean ± std (the last 20 episodes of each seed), env steps to
``train.targetReturn`` (median and range; with ``--to-target`` a run stops there), env steps/s
and wall time (training only: a cluster's process start-up is left out and shown per seed), and
CleanRL's published figure for the env where one exists. ``--png`` draws the curves of every
seed; ``--json`` writes the raw curves.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from rlkube.jobfile import load_job
from rlkube.spec import RLJob

from benchmarks.learn.curve import Curve, mean_std, smoothed

#: One run of one side: ``runner(job, seed=, budget=, stop_at_target=) -> Curve``.
Runner = Callable[..., Curve]

#: CleanRL's published PPO returns (mean ± std over seeds): ppo_continuous_action.py at 1M steps
#: (MuJoCo v4) and ppo_atari.py at 10M steps (NoFrameskip-v4); keyed by the game's name.
PUBLISHED: dict[str, tuple[float, float, str]] = {
    "HalfCheetah": (1442.6, 46.0, "CleanRL ppo_continuous_action, 1M steps, v4"),
    "Walker2d": (2288.0, 571.8, "CleanRL ppo_continuous_action, 1M steps, v4"),
    "Hopper": (2382.9, 271.7, "CleanRL ppo_continuous_action, 1M steps, v4"),
    "Breakout": (414.7, 28.1, "CleanRL ppo_atari, 10M steps, NoFrameskip-v4"),
    "Pong": (20.4, 0.2, "CleanRL ppo_atari, 10M steps, NoFrameskip-v4"),
}


#: The policies the PPO figures compare with (not SAC: an off-policy learner's figures differ).
PPO_POLICIES = frozenset({"PPO", "RSLRLPolicy"})


def published(job: RLJob) -> tuple[float, float, str] | None:
    if job.spec.policy.type not in PPO_POLICIES:
        return None
    game = job.spec.env.id.split("/")[-1].split("-")[0].replace("NoFrameskip", "")
    return PUBLISHED.get(game)


def curve_at(curves: Sequence[Curve], steps: int) -> float | None:
    """Median over seeds of the 20-episode mean at ``steps`` (seeds without an episode yet skipped)."""
    values = []
    for curve in curves:
        points = [value for at, value in smoothed(curve.episodes) if at <= steps]
        if points:
            values.append(points[-1])
    return statistics.median(values) if values else None


def report(job: RLJob, budget: int, curves: dict[str, list[Curve]]) -> str:
    sides = list(curves)
    seeds = [c.seed for c in curves[sides[0]]]
    lines = [f"{job.name} ({job.spec.env.id}), {budget:,} env steps budget, seeds {seeds}"]
    lines.append("")
    lines.append("learning curve: median over seeds of the mean raw return of the last 20 episodes")
    lines.append(f"{'env steps':>12}" + "".join(f"{side:>16}" for side in sides))
    for tenth in range(1, 11):
        at = budget * tenth // 10
        row = f"{at:>12,}"
        for side in sides:
            value = curve_at(curves[side], at)
            row += f"{value:>16.1f}" if value is not None else f"{'-':>16}"
        lines.append(row)
    lines.append("")
    header = f"{'':>14}{'final return':>22}{'steps to target':>28}{'env steps/s':>14}{'wall s':>10}"
    lines.append(header)
    target = job.spec.train.target_return
    for side in sides:
        runs = curves[side]
        finals = [f for f in (c.final_return() for c in runs) if f is not None]
        mean, std = mean_std(finals)
        reached = sorted(c.steps_to_target for c in runs if c.steps_to_target is not None)
        if target is None:
            to_target = "n/a"
        elif reached:
            spread = f"({reached[0]:,}-{reached[-1]:,})"
            to_target = f"{statistics.median(reached):,.0f} {spread} {len(reached)}/{len(runs)}"
        else:
            to_target = f"not reached 0/{len(runs)}"
        rate = statistics.fmean(c.steps_per_second for c in runs)
        wall = statistics.fmean(c.wall_seconds for c in runs)
        lines.append(f"{side:>14}{mean:>13.1f} ± {std:<6.1f}{to_target:>28}{rate:>14,.0f}{wall:>10.1f}")
    figure = published(job)
    if figure is not None:
        lines.append(f"{'CleanRL':>14}{figure[0]:>13.1f} ± {figure[1]:<6.1f}  (published: {figure[2]})")
    if len(sides) >= 2 and target is not None:
        medians: dict[str, float] = {}
        for side in sides:
            reached = [c.steps_to_target for c in curves[side] if c.steps_to_target is not None]
            if reached:
                medians[side] = statistics.median(reached)
        last = sides[-1]  # the peer, when there is one
        ratios = [
            f"{side} / {last} = {medians[side] / medians[last]:.2f}"
            for side in sides[:-1]
            if side in medians and last in medians
        ]
        if ratios:
            lines.append(f"\nmedian steps to {target:g}: " + ", ".join(ratios))
    return "\n".join(lines)


def plot(job: RLJob, curves: dict[str, list[Curve]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    colours = {"rlkube": "tab:blue", "rlkube-cluster": "tab:purple", "sb3": "tab:orange"}
    for side, runs in curves.items():
        for index, curve in enumerate(runs):
            points = smoothed(curve.episodes)
            if points:
                xs, ys = zip(*points, strict=True)
                ax.plot(xs, ys, color=colours.get(side), alpha=0.7, label=side if index == 0 else None)
    figure = published(job)
    if figure is not None:
        ax.axhline(figure[0], color="grey", linestyle="--", label=f"CleanRL published ({figure[0]:g})")
    if job.spec.train.target_return is not None:
        ax.axhline(job.spec.train.target_return, color="green", linestyle=":", label="target")
    ax.set_xlabel("env steps")
    ax.set_ylabel("raw return (mean of last 20 episodes)")
    ax.set_title(f"{job.name}: {job.spec.env.id}")
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def interleaved(sides: Sequence[str], seed: int) -> list[str]:
    """The order of the sides for ``seed``: rotated by one per seed (two sides: alternating)."""
    shift = seed % len(sides)
    return [*sides[shift:], *sides[:shift]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rlkube bench learn", description=__doc__.splitlines()[0])
    parser.add_argument("job", nargs="?", default="examples/cartpole.yaml", help="a reference job")
    parser.add_argument("--seeds", type=int, default=3, help="seeds 1..N per side")
    parser.add_argument("--first-seed", type=int, default=1)
    parser.add_argument("--steps", type=int, default=100_000, help="env step budget per run")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="PATH=VALUE")
    parser.add_argument("--to-target", action="store_true", help="stop a run at train.targetReturn")
    parser.add_argument(
        "--mode",
        choices=["in-process", "cluster", "both"],
        default="in-process",
        help="how rlkube runs: in this process, as a local cluster (what `rlkube run` starts), or both",
    )
    parser.add_argument(
        "--evaluators",
        type=int,
        default=None,
        metavar="N",
        help="eval workers of the cluster run (default: the job's evaluator.replicas)",
    )
    parser.add_argument("--peer", choices=["sb3", "none"], default="sb3")
    parser.add_argument("--png", type=Path, default=None, help="write the curves here")
    parser.add_argument("--json", type=Path, default=None, help="write the raw curves here")
    args = parser.parse_args(argv)
    if args.evaluators is not None and args.evaluators < 1:
        parser.error(f"--evaluators must be at least 1, got {args.evaluators}")

    from benchmarks.learn.cluster_side import ClusterRunFailed
    from benchmarks.learn.rlkube_side import run_rlkube

    job = load_job(args.job, args.overrides)
    runners: dict[str, Runner] = {}
    if args.mode in ("in-process", "both"):
        runners["rlkube"] = run_rlkube
    if args.mode in ("cluster", "both"):
        from rlkube.launch.preflight import preflight

        from benchmarks.learn.cluster_side import SIDE, run_rlkube_cluster

        refusal = preflight(job).refusal
        if refusal is not None:
            print(f"rlkube bench learn: invalid job {args.job}: {refusal.message}", file=sys.stderr)
            return 2
        runners[SIDE] = functools.partial(run_rlkube_cluster, evaluators=args.evaluators)
    if args.peer == "sb3":
        try:
            from benchmarks.learn.sac_peer import run_sb3_sac
            from benchmarks.learn.sb3_peer import run_sb3
        except ImportError as exc:
            print(f"rlkube bench learn: the SB3 peer needs the bench extra ({exc})", file=sys.stderr)
            return 2
        runners["sb3"] = run_sb3_sac if job.spec.policy.type == "SAC" else run_sb3
    curves: dict[str, list[Curve]] = {side: [] for side in runners}
    try:
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            for side in interleaved(list(runners), seed):
                curve = runners[side](job, seed=seed, budget=args.steps, stop_at_target=args.to_target)
                curves[side].append(curve)
                final = curve.final_return()
                shown = f"{final:.1f}" if final is not None else "-"
                startup = f" (+{curve.startup_seconds:.1f} s start-up)" if curve.startup_seconds else ""
                print(
                    f"  {side:>14} seed {seed}: {curve.env_steps:,} steps, final {shown}, "
                    f"to target {curve.steps_to_target}, {curve.wall_seconds:.1f} s{startup}",
                    flush=True,
                )
    except KeyboardInterrupt:
        print("\nrlkube bench learn: interrupted (every process it started is stopped)", file=sys.stderr)
        return 130
    except ClusterRunFailed as exc:  # its processes are stopped already
        print(f"rlkube bench learn: {exc}", file=sys.stderr)
        return 1
    print()
    print(report(job, args.steps, curves))
    if args.png is not None:
        plot(job, curves, args.png)
        print(f"\ncurves: {args.png}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        rows = [
            {
                "side": c.side,
                "seed": c.seed,
                "episodes": c.episodes,
                "env_steps": c.env_steps,
                "wall_seconds": c.wall_seconds,
                "startup_seconds": c.startup_seconds,
                "steps_to_target": c.steps_to_target,
            }
            for runs in curves.values()
            for c in runs
        ]
        args.json.write_text(json.dumps({"job": job.name, "budget": args.steps, "runs": rows}, indent=1))
    return 0
