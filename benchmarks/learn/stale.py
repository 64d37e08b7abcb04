"""``rlkube bench stale``: stale fragments dropped or corrected by V-trace, against the sync engine.

One reference job (default ``examples/cartpole.yaml``) runs as a local cluster (what ``rlkube run``
starts, ``--evaluators`` eval workers) in each variant, interleaved per seed in one process run:

* ``sync``: the sync engine (every fragment from the newest weights);
* ``drop``: ``engine: async``, ``staleFragments: drop`` at ``--staleness`` (older fragments dropped);
* ``vtrace``: ``engine: async``, ``staleFragments: vtrace`` at the same bound (corrected, none dropped);
* ``vtrace-behaviour``: the same with ``vtraceClipAnchor: behaviour`` (the clipped ratio against
  the behaviour policy, as RLightning's ``ppo_vtrace``, instead of the learner's).

Printed per variant: env steps to ``train.targetReturn`` *trained on* (what the tracker counts)
and *collected* (trained plus dropped: what the envs paid for), wall seconds of the run (process
start-up left out), the share of fragments used, the fragments corrected with V-trace and the lag
distribution.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Sequence

from rlkube.jobfile import load_job
from rlkube.spec import Engine, RLJob, StaleFragments, VtraceClipAnchor

from benchmarks.learn.cluster_side import run_rlkube_cluster
from benchmarks.learn.curve import Curve
from benchmarks.learn.run import interleaved

VARIANTS: dict[str, tuple[Engine, StaleFragments, VtraceClipAnchor]] = {
    "sync": (Engine.SYNC, StaleFragments.DROP, VtraceClipAnchor.LEARNER),
    "drop": (Engine.ASYNC, StaleFragments.DROP, VtraceClipAnchor.LEARNER),
    "vtrace": (Engine.ASYNC, StaleFragments.VTRACE, VtraceClipAnchor.LEARNER),
    "vtrace-behaviour": (Engine.ASYNC, StaleFragments.VTRACE, VtraceClipAnchor.BEHAVIOUR),
}


def variant(job: RLJob, name: str, *, staleness: int) -> RLJob:
    engine, stale, anchor = VARIANTS[name]
    spec = job.spec
    train = spec.train.model_copy(
        update={"max_staleness": staleness, "stale_fragments": stale, "vtrace_clip_anchor": anchor}
    )
    updated = spec.model_copy(update={"engine": engine, "train": train})
    return RLJob.model_validate(job.model_copy(update={"spec": updated}).model_dump(by_alias=True))


def collected_to_target(curve: Curve) -> float | None:
    """Env steps the envs paid for up to the target: trained steps over the share of fragments used."""
    if curve.steps_to_target is None:
        return None
    share = float(curve.summary.get("fragments_used_share", 1.0) or 1.0)
    return curve.steps_to_target / share


def median_text(values: Sequence[float | None]) -> str:
    reached = sorted(v for v in values if v is not None)
    if not reached:
        return f"not reached 0/{len(values)}"
    spread = f"({reached[0]:,.0f}-{reached[-1]:,.0f})"
    return f"{statistics.median(reached):,.0f} {spread} {len(reached)}/{len(values)}"


def report(job: RLJob, staleness: int, evaluators: int | None, curves: dict[str, list[Curve]]) -> str:
    lines = [
        f"{job.name} ({job.spec.env.id}) as a local cluster, {evaluators or job.spec.evaluator.replicas} "
        f"eval workers, maxStaleness {staleness}, target {job.spec.train.target_return}",
        "",
        f"{'variant':>16}{'trained steps to target':>34}{'collected steps to target':>34}"
        f"{'wall s':>9}{'used':>7}{'corrected':>11}  lags",
    ]
    for name, runs in curves.items():
        walls = statistics.fmean(c.wall_seconds for c in runs)
        used = statistics.fmean(float(c.summary.get("fragments_used_share", 1.0)) for c in runs)
        corrected = sum(int(c.summary.get("corrected_stale", 0)) for c in runs)
        lags: dict[str, int] = {}
        for c in runs:
            for lag, count in (c.summary.get("lag_distribution") or {}).items():
                lags[lag] = lags.get(lag, 0) + int(count)
        lines.append(
            f"{name:>16}{median_text([c.steps_to_target for c in runs]):>34}"
            f"{median_text([collected_to_target(c) for c in runs]):>34}"
            f"{walls:>9.1f}{used:>7.2f}{corrected:>11}  {dict(sorted(lags.items())) or '-'}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rlkube bench stale", description=__doc__.splitlines()[0])
    parser.add_argument("job", nargs="?", default="examples/cartpole.yaml")
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--first-seed", type=int, default=1)
    parser.add_argument("--steps", type=int, default=300_000, help="env step budget per run")
    parser.add_argument("--staleness", type=int, default=0, help="train.maxStaleness of the async variants")
    parser.add_argument("--evaluators", type=int, default=None)
    parser.add_argument("--variants", default="sync,drop,vtrace")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="PATH=VALUE")
    args = parser.parse_args(argv)
    job = load_job(args.job, args.overrides)
    names = [name for name in args.variants.split(",") if name]
    unknown = sorted(set(names) - set(VARIANTS))
    if unknown:
        parser.error(f"--variants: unknown {unknown} (known: {sorted(VARIANTS)})")
    curves: dict[str, list[Curve]] = {name: [] for name in names}
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        for name in interleaved(names, seed):
            run = variant(job, name, staleness=args.staleness)
            curve = run_rlkube_cluster(
                run, seed=seed, budget=args.steps, stop_at_target=True, evaluators=args.evaluators
            )
            curves[name].append(curve)
            print(
                f"  {name:>16} seed {seed}: to target {curve.steps_to_target}, {curve.wall_seconds:.1f} s, "
                f"used {curve.summary.get('fragments_used_share', 1.0)}",
                flush=True,
            )
    print()
    print(report(job, args.staleness, args.evaluators, curves))
    return 0
