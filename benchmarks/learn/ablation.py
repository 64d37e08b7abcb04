"""``rlkube bench ablation JOB``: the built-in PPO's switches on and off against SB3, in parallel.

Each *arm* is a set of ``--set`` overrides of the job (or the SB3 peer with the job as written);
every arm runs for every seed, each run in its own process (``--jobs N`` at once, so a 16-core
machine runs 14 at a time), one torch thread each. A run writes its raw curve to
``OUT/ARM-seedS.json`` as soon as it ends (an interrupted ablation keeps what finished, and
``--resume`` skips runs whose file exists; a running one keeps its episodes so far in
``ARM-seedS.partial.json``, rewritten every minute). Printed, and written to ``OUT/table.txt``: per arm,
the mean over seeds of the 20-episode mean return at tenths of the budget, and the final return
(last 20 episodes) per seed, its mean and a 95% t-interval over seeds; the load average at the
start and end of each run is kept in its file.

The arms (:data:`ARMS`) are the differences between rlkube's PPO and SB3's that remain once the
peer's mapping (``sb3_peer.py``) has given SB3 the job's settings:

* ``clipVlossForm: clipped`` -- SB3's ``clip_range_vf`` trains the clipped value's loss alone;
  rlkube's default (CleanRL's) the larger of the clipped and unclipped losses.
* ``observationStats: perStep`` -- SB3's ``VecNormalize`` moves the observation statistics at
  every env step (the first rollout included); rlkube's default once per update.

``rlkube bench ablation examples/halfcheetah.yaml --seeds 2 3 --steps 300000 --jobs 14``
reproduces the table in docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks.learn.curve import Curve, smoothed

PEER = "sb3"

#: arm -> overrides of the job (``--set`` syntax); the peer arm is SB3's PPO on the job as written.
ARMS: dict[str, tuple[str, ...]] = {
    "rlkube": (),
    "vclip-clipped": ("spec.policy.algoCfg.clipVlossForm=clipped",),
    "stats-per-step": ("spec.policy.modelCfg.observationStats=perStep",),
    "both": (
        "spec.policy.algoCfg.clipVlossForm=clipped",
        "spec.policy.modelCfg.observationStats=perStep",
    ),
    "no-vclip": ("spec.policy.algoCfg.clipVloss=false",),
    PEER: (),
}

#: Two-sided 95% Student t quantiles by degrees of freedom (seeds - 1).
_T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def interval(values: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% t-interval (0 for one value)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, 0.0
    t = _T95.get(len(values) - 1, 1.96)
    return mean, t * statistics.stdev(values) / math.sqrt(len(values))


def _dump_partial(curve: Curve, path: Path, stop: threading.Event) -> None:
    while not stop.wait(60.0):
        episodes = list(curve.episodes)
        path.write_text(json.dumps({"episodes": episodes, "load_average": os.getloadavg()[0]}))


def run_one(
    job_path: str, arm: str, seed: int, budget: int, extra: list[str], partial: Path | None = None
) -> dict[str, Any]:
    """One arm, one seed, in this process; the curve and its conditions as a JSON-able dict."""
    import torch
    from rlkube.jobfile import load_job

    torch.set_num_threads(1)
    job = load_job(job_path, [*extra, *ARMS[arm]])
    load_before = os.getloadavg()[0]
    curve = Curve(side=arm, seed=seed)
    stop = threading.Event()
    if partial is not None:  # the episodes so far, every minute (a run cut off keeps its curve)
        threading.Thread(target=_dump_partial, args=(curve, partial, stop), daemon=True).start()
    try:
        if arm == PEER:
            from benchmarks.learn.sb3_peer import run_sb3

            run_sb3(job, seed=seed, budget=budget, stop_at_target=False, into=curve)
        else:
            from benchmarks.learn.rlkube_side import run_rlkube

            run_rlkube(job, seed=seed, budget=budget, stop_at_target=False, into=curve)
    finally:
        stop.set()
    return {
        "arm": arm,
        "overrides": [*extra, *ARMS[arm]],
        "seed": seed,
        "budget": budget,
        "env_steps": curve.env_steps,
        "wall_seconds": curve.wall_seconds,
        "load_average": [load_before, os.getloadavg()[0]],
        "final_return": curve.final_return(),
        "episodes": curve.episodes,
    }


def curve_mean_at(runs: list[dict[str, Any]], steps: int) -> float | None:
    values = []
    for run in runs:
        points = [value for at, value in smoothed([tuple(e) for e in run["episodes"]]) if at <= steps]
        if points:
            values.append(points[-1])
    return statistics.fmean(values) if values else None


def table(runs: list[dict[str, Any]], budget: int, arms: list[str]) -> str:
    by_arm = {arm: sorted((r for r in runs if r["arm"] == arm), key=lambda r: r["seed"]) for arm in arms}
    lines = ["mean over seeds of the 20-episode mean raw return"]
    lines.append(f"{'env steps':>10}" + "".join(f"{arm:>16}" for arm in arms))
    for tenth in range(1, 11):
        at = budget * tenth // 10
        row = f"{at:>10,}"
        for arm in arms:
            value = curve_mean_at(by_arm[arm], at)
            row += f"{value:>16.1f}" if value is not None else f"{'-':>16}"
        lines.append(row)
    lines.append("")
    lines.append(f"{'arm':>16}  {'final return by seed':<36}{'mean ± 95% CI':>20}{'steps/s':>9}  load")
    for arm in arms:
        done = [r for r in by_arm[arm] if r["final_return"] is not None]
        if not done:
            continue
        seeds = " ".join(f"s{r['seed']}:{r['final_return']:.0f}" for r in done)
        mean, half = interval([r["final_return"] for r in done])
        rate = statistics.fmean(r["env_steps"] / r["wall_seconds"] for r in done if r["wall_seconds"])
        loads = [value for r in done for value in r["load_average"]]
        load = f"{min(loads):.1f}-{max(loads):.1f}"
        lines.append(f"{arm:>16}  {seeds:<36}{mean:>11.1f} ± {half:<6.1f}{rate:>9.0f}  {load}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rlkube bench ablation", description=__doc__.splitlines()[0])
    parser.add_argument("job", nargs="?", default="examples/halfcheetah.yaml")
    parser.add_argument("--seeds", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--steps", type=int, default=300_000, help="env step budget per run")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of {', '.join(ARMS)}")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="PATH=VALUE")
    parser.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) - 2))
    parser.add_argument("--out", type=Path, default=Path("runs/ablation"))
    parser.add_argument("--resume", action="store_true", help="skip runs whose result file exists")
    parser.add_argument(
        "--table-only", action="store_true", help="print the table of OUT's files, run nothing"
    )
    parser.add_argument("--one", nargs=2, metavar=("ARM", "SEED"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    arms = [a for a in args.arms.split(",") if a]
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        parser.error(f"unknown arms {unknown} (known: {', '.join(ARMS)})")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.one is not None:  # a child: one run, its file written at the end
        arm, seed = args.one[0], int(args.one[1])
        partial = args.out / f"{arm}-seed{seed}.partial.json"
        result = run_one(args.job, arm, seed, args.steps, args.overrides, partial)
        (args.out / f"{arm}-seed{seed}.json").write_text(json.dumps(result))
        partial.unlink(missing_ok=True)
        return 0

    def child(arm: str, seed: int) -> None:
        path = args.out / f"{arm}-seed{seed}.json"
        if args.resume and path.exists():
            return
        command = [sys.executable, "-m", "benchmarks.learn.ablation", args.job, "--one", arm, str(seed)]
        command += ["--steps", str(args.steps), "--out", str(args.out)]
        command += [f"--set={o}" for o in args.overrides]
        started = time.monotonic()
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            print(f"  {arm} seed {seed}: failed ({done.returncode})\n{done.stderr[-2000:]}", flush=True)
            return
        final = json.loads(path.read_text())["final_return"]
        print(f"  {arm} seed {seed}: final {final:.1f}, {time.monotonic() - started:.0f} s", flush=True)

    # Seed-major order: every arm of a seed runs close together in time (load hits arms alike).
    order = [(arm, seed) for seed in args.seeds for arm in arms]
    if not args.table_only:
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            list(pool.map(lambda pair: child(*pair), order))
    files = [p for p in sorted(args.out.glob("*-seed*.json")) if not p.name.endswith(".partial.json")]
    runs = [json.loads(p.read_text()) for p in files]
    runs = [r for r in runs if r["arm"] in arms and r["seed"] in args.seeds and r["budget"] == args.steps]
    text = table(runs, args.steps, arms)
    for path in sorted(args.out.glob("*.partial.json")):  # runs cut off (or still running)
        episodes = [tuple(e) for e in json.loads(path.read_text())["episodes"]]
        if episodes:
            at, value = smoothed(episodes)[-1]
            text += f"\n{path.name}: unfinished, 20-episode mean {value:.1f} at {at:,} env steps"
    (args.out / "table.txt").write_text(text + "\n")
    print()
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
