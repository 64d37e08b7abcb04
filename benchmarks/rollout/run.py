"""``rlkube bench rollout``: env steps/s of the local cluster for 1, 2, 4 eval workers, sync vs async.

Every measurement runs in both request modes (``--requests``): ``batched`` (the built-in ``PPO``:
one ``rollout_step`` call per step for the 8 envs of a worker) and ``per-env`` (``PPOPerEnv``, the
same network served one env per call as RLightning does, ``benchmarks/rollout/per_env.py``). The
``bound`` rows of the two modes give the per-env request overhead in microseconds per env step.

Measures, in one run and side by side:

* ``bound``: one process stepping the same EnvGroup with the same EVAL policy and nothing else
  (no training, no network) -- what one core can roll out;
* ``in-process``: ``rlkube run --in-process`` (rollout and training alternate in one process);
* ``cluster``: ``rlkube run`` as a local cluster (1 train rank, K eval workers as processes,
  fragments over gRPC, weights through the shm buffer) with the sync and the async engine;
* ``ray`` (the peer, when Ray is installed): RLightning's synchronous loop on Ray -- K Ray actors
  with the same envs and policy, weights through the object store every epoch, fragments
  returned pickled (``benchmarks/rollout/ray_peer.py``).

For each cluster run it reports env steps per second of wall time (training included) and the
fraction of eval-worker time spent waiting for weights instead of rolling out.

Beside every row, the ceiling that applies and the share of it achieved: ``min(learner, workers x
bound, intake)``, where ``bound`` is the bound row, the learner's ceiling is what the in-process
row leaves after its rollouts (``1 / (1/in-process - 1/bound)`` env steps/s), and ``intake`` is
the trajectory plane's own ceiling with as many producers as workers (``rlkube bench intake``:
synthetic fragments of the same shape flooding a real coordinator, no env and no learner; its
fragments/s and env steps/s are printed in their own columns). On a machine
with C cores, K workers plus a trainer contend for them: the figures show where that bites.
``--json PATH`` writes one row per measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rlkube.engine.rollout import RolloutWorker
from rlkube.engine.run_paths import RunPaths
from rlkube.envs.group import EnvGroup
from rlkube.jobfile import dump_job
from rlkube.launch.in_process import InProcessRun
from rlkube.launch.local import Layout, Ports, Supervisor, supervise
from rlkube.policy import POLICIES, PolicyRole, import_modules
from rlkube.spec import RLJob, parse_job

#: request mode -> (policy type, modules to import for it)
REQUEST_MODES: dict[str, tuple[str, list[str]]] = {
    "batched": ("PPO", []),
    "per-env": ("PPOPerEnv", ["benchmarks.rollout.per_env"]),
}


def job(*, engine: str, workers: int, epochs: int, steps_per_epoch: int, requests: str = "batched") -> RLJob:
    policy_type, imports = REQUEST_MODES[requests]
    return parse_job(
        {
            "apiVersion": "rlkube.io/v1alpha1",
            "kind": "RLJob",
            "metadata": {"name": f"bench-{engine}-{workers}-{requests}"},
            "spec": {
                "engine": engine,
                "imports": imports,
                "policy": {
                    "type": policy_type,
                    "modelCfg": {"hiddenSizes": [64, 64]},
                    "algoCfg": {"updateEpochs": 4},
                    "weightBuffer": {"strategy": "Shared"},
                },
                "env": {"id": "CartPole-v1", "numEnvs": 8},
                "train": {
                    "maxEpochs": epochs,
                    "stepsPerEpoch": steps_per_epoch,
                    "fragmentLength": 32,
                    "batchSize": 256,
                    "evalInterval": 0,
                    "saveInterval": 0,
                    "maxStaleness": 2,
                },
                "buffer": {"capacity": 2 * max(1, steps_per_epoch // 256)},
                "trainer": {"replicas": 1},
                "evaluator": {"replicas": workers},
                "log": {"tensorboard": False},
            },
        }
    )


def measure_bound(spec: RLJob, steps: int) -> dict[str, Any]:
    """One process, rollouts only: the same envs and policy forward pass, nothing else."""
    policy = POLICIES.get(spec.spec.policy.type)(spec.spec.policy.model_copy(update={}), PolicyRole.EVAL)
    with EnvGroup.from_spec(spec.spec.env, base_seed=1) as group:
        group.reset()
        policy.init_eval(None, env_meta=group.meta)
        worker = RolloutWorker(group, policy)
        worker.collect(32)  # warm-up
        started = time.perf_counter()
        collected = 0
        while collected < steps:
            collected += worker.collect(32).env_steps
        seconds = time.perf_counter() - started
    policy.close()
    return {"method": "bound", "engine": "-", "workers": 1, "env_steps": collected, "seconds": seconds}


def measure_in_process(spec: RLJob, root: Path) -> dict[str, Any]:
    paths = RunPaths(root / f"in-process-{spec.name}").create()
    summary = InProcessRun(spec, POLICIES.get(spec.spec.policy.type), paths=paths).run()
    return {
        "method": "in-process",
        "engine": "sync",
        "workers": 1,
        "env_steps": summary.env_steps,
        "seconds": summary.wall_seconds,
    }


def measure_cluster(spec: RLJob, root: Path, *, nodes: int) -> dict[str, Any]:
    paths = RunPaths(root / spec.name).create()
    paths.job.write_text(dump_job(spec))
    layout = Layout(
        job=spec,
        run_dir=paths.run_dir,
        shm_root=Path("/dev/shm") / f"rlkube-bench-rollout-{secrets.token_hex(4)}",
        nodes=nodes,
        ports=Ports.allocate(spec.spec.trainer.replicas),
    )
    outcome = supervise(Supervisor(layout))
    if outcome.code != 0:
        raise RuntimeError(f"{spec.name} failed: {outcome.message}")
    summary = json.loads(paths.summary.read_text())
    return {
        "method": "cluster",
        "engine": spec.spec.engine.value,
        "workers": spec.spec.evaluator.replicas,
        "env_steps": summary["env_steps"],
        # From the first eval worker's registration (the Ray rows start once their actors are up).
        "seconds": summary["wall_seconds"] - summary.get("seconds_to_first_worker", 0.0),
        "startup_seconds": summary.get("seconds_to_first_worker"),
        "weight_wait_fraction": summary.get("weight_wait_fraction"),
        "dropped_stale": summary.get("dropped_stale", 0),
    }


def measure_ray(args: argparse.Namespace, requests: str) -> list[dict[str, Any]]:
    try:
        import ray
    except ImportError:
        print("ray is not installed: the Ray rows are skipped (pip install -e .[bench])", file=sys.stderr)
        return []
    from benchmarks.rollout.ray_peer import measure_ray_sync

    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    rows = []
    try:
        for workers in args.workers:
            spec = job(
                engine="sync",
                workers=workers,
                epochs=args.epochs,
                steps_per_epoch=args.steps_per_epoch,
                requests=requests,
            )
            print(
                f"running the Ray peer with {workers} eval worker(s), {requests} requests...",
                file=sys.stderr,
                flush=True,
            )
            raw = spec.model_dump(mode="json", by_alias=True, exclude={"status"}, exclude_none=True)
            rows.append({**measure_ray_sync(spec, raw, workers=workers), "requests": requests})
    finally:
        ray.shutdown()
    return rows


def learner_ceiling(bound: float, in_process: float) -> float | None:
    """Env steps/s the learner alone could take: what the in-process row spends beyond its rollouts. Pure."""
    if bound <= 0 or in_process <= 0 or in_process >= bound:
        return None
    return 1.0 / (1.0 / in_process - 1.0 / bound)


def add_ceilings(rows: list[dict[str, Any]], intake: dict[int, dict[str, Any]]) -> None:
    """Give every row its ceiling (``min(learner, workers x bound, intake)``) and the share achieved."""
    bound = {r["requests"]: r["steps_per_second"] for r in rows if r["method"] == "bound"}
    in_process = {r["requests"]: r["steps_per_second"] for r in rows if r["method"] == "in-process"}
    for r in rows:
        one = bound.get(r["requests"], 0.0)
        learner = learner_ceiling(one, in_process.get(r["requests"], 0.0))
        limits = {"envs": r["workers"] * one}
        if r["method"] not in ("bound",) and learner is not None:
            limits["learner"] = learner
        plumbing = intake.get(r["workers"], {}) if r["method"] == "cluster" else {}
        if plumbing.get("env_steps_per_second"):
            limits["intake"] = plumbing["env_steps_per_second"]
            r["intake_fragments_per_second"] = plumbing["fragments_per_second"]
            r["intake_env_steps_per_second"] = plumbing["env_steps_per_second"]
        if learner is not None:
            r["learner_ceiling"] = learner
        limit = min(limits, key=lambda name: limits[name])
        r["ceiling"], r["ceiling_is"] = limits[limit], limit
        r["of_ceiling"] = r["steps_per_second"] / limits[limit] if limits[limit] else 0.0


def table(rows: list[dict[str, Any]]) -> str:
    """One line per row; ``vs bound``/``vs ray``: over the bound or the Ray peer of the same request mode."""
    bound = {r["requests"]: r["steps_per_second"] for r in rows if r["method"] == "bound"}
    ray = {(r["requests"], r["workers"]): r["steps_per_second"] for r in rows if r["method"] == "ray"}
    lines = [
        f"{'method':11s} {'requests':8s} {'engine':6s} {'workers':>7s} {'env steps':>10s} {'seconds':>8s} "
        f"{'steps/s':>9s} {'vs bound':>8s} {'vs ray':>7s} {'waiting for weights':>20s} "
        f"{'intake frag/s':>13s} {'intake steps/s':>14s} {'ceiling (which)':>20s} {'of ceiling':>10s}",
    ]
    for r in rows:
        wait = r.get("weight_wait_fraction")
        peer = ray.get((r["requests"], r["workers"])) if r["method"] == "cluster" else None
        versus = f"{r['steps_per_second'] / peer:.2f}x" if peer else "-"
        frags, steps = r.get("intake_fragments_per_second"), r.get("intake_env_steps_per_second")
        ceiling = f"{r['ceiling']:,.0f} ({r['ceiling_is']})" if "ceiling" in r else "-"
        share = f"{r['of_ceiling']:.2f}" if "of_ceiling" in r else "-"
        lines.append(
            f"{r['method']:11s} {r['requests']:8s} {r['engine']:6s} {r['workers']:7d} {r['env_steps']:10,d} "
            f"{r['seconds']:8.1f} {r['steps_per_second']:9,.0f} "
            f"{r['steps_per_second'] / bound[r['requests']]:8.2f} {versus:>7s} "
            f"{'-' if wait is None else f'{100 * wait:.1f}%':>20s} "
            f"{'-' if frags is None else f'{frags:,.0f}':>13s} "
            f"{'-' if steps is None else f'{steps:,.0f}':>14s} "
            f"{ceiling:>20s} {share:>10s}"
        )
    if "batched" in bound and "per-env" in bound and bound["batched"] and bound["per-env"]:
        overhead = 1e6 * (1 / bound["per-env"] - 1 / bound["batched"])
        lines.append(
            f"per-env requests cost {overhead:.1f} us per env step more than batched ones "
            f"(bound rows: {bound['per-env']:,.0f} vs {bound['batched']:,.0f} steps/s, 8 envs per worker)"
        )
    return "\n".join(lines)


def announce(row: dict[str, Any]) -> dict[str, Any]:
    """Prints a row as it is measured, so a run stopped by a time limit still leaves its figures."""
    rate = row["env_steps"] / row["seconds"] if row["seconds"] > 0 else 0.0
    print(
        f"  measured: {row['method']} {row['engine']} {row['workers']} worker(s): {rate:,.0f} env steps/s",
        file=sys.stderr,
        flush=True,
    )
    return row


def measure_bounds(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The bound of every request mode, measured in turns ``--bound-repeats`` times; the best of each.

    Taking turns and keeping the fastest round makes the ratio between the modes (the per-env
    request overhead) robust to other load on the machine.
    """
    best: dict[str, dict[str, Any]] = {}
    steps = args.epochs * args.steps_per_epoch // 2
    for _ in range(args.bound_repeats):
        for requests in args.requests:
            spec = job(
                engine="sync",
                workers=1,
                epochs=args.epochs,
                steps_per_epoch=args.steps_per_epoch,
                requests=requests,
            )
            row = announce({**measure_bound(spec, steps), "requests": requests})
            if requests not in best or row["seconds"] < best[requests]["seconds"]:
                best[requests] = row
    return list(best.values())


def measure_requests(args: argparse.Namespace, root: Path, requests: str) -> list[dict[str, Any]]:
    """Every method with one request mode."""
    rows: list[dict[str, Any]] = []
    base = job(
        engine="sync", workers=1, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch, requests=requests
    )
    rows.append(announce(measure_in_process(base, root)))
    # --quick (the test that keeps the bench from rotting) runs the second mode once, not the grid
    second = args.quick and requests != args.requests[0]
    for engine in args.engines[:1] if second else args.engines:
        for workers in args.workers[:1] if second else args.workers:
            spec = job(
                engine=engine,
                workers=workers,
                epochs=args.epochs,
                steps_per_epoch=args.steps_per_epoch,
                requests=requests,
            )
            print(
                f"running {engine} with {workers} eval worker(s), {requests} requests...",
                file=sys.stderr,
                flush=True,
            )
            rows.append(announce(measure_cluster(spec, root, nodes=min(args.nodes, workers))))
    for row in rows:
        row["requests"] = requests
    if not args.no_ray and not second:
        rows += measure_ray(args, requests)
    return rows


def measure_intake(args: argparse.Namespace) -> dict[int, dict[str, Any]]:
    """The trajectory plane's ceiling with as many producers as each row's workers (same fragment shape)."""
    if args.ceiling_seconds <= 0:
        return {}
    from benchmarks.rollout.intake import ceiling

    found = {}
    for workers in sorted(set(args.workers)):
        print(f"measuring the intake ceiling with {workers} producer(s)...", file=sys.stderr, flush=True)
        found[workers] = ceiling(shape="cartpole", producers=workers, seconds=args.ceiling_seconds)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rlkube bench rollout", description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--engines", nargs="+", default=["sync", "async"], choices=["sync", "async"])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--steps-per-epoch", type=int, default=2048)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="1 and 2 workers, 4 short epochs (for tests)")
    parser.add_argument("--json", type=Path, default=None, help="write one row per measurement here")
    parser.add_argument("--no-ray", action="store_true", help="skip the Ray peer")
    parser.add_argument("--bound-repeats", type=int, default=3, help="rounds of the bound rows (best kept)")
    parser.add_argument(
        "--ceiling-seconds",
        type=float,
        default=5.0,
        help="window of each intake-ceiling run (rlkube bench intake, one per worker count; 0: skip)",
    )
    parser.add_argument(
        "--requests",
        nargs="+",
        default=["batched", "per-env"],
        choices=sorted(REQUEST_MODES),
        help="request modes to measure (each method runs in each)",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.workers, args.epochs, args.steps_per_epoch = [1, 2], 4, 512
        args.ceiling_seconds = min(args.ceiling_seconds, 1.5)
    rows: list[dict[str, Any]] = []
    import_modules(module for mode in args.requests for module in REQUEST_MODES[mode][1])
    intake = measure_intake(args)
    rows += measure_bounds(args)
    with tempfile.TemporaryDirectory(prefix="rlkube-bench-rollout-") as tmp:
        root = Path(tmp)
        for requests in args.requests:
            rows += measure_requests(args, root, requests)

    for row in rows:
        row["steps_per_second"] = row["env_steps"] / row["seconds"] if row["seconds"] > 0 else 0.0
        row["scenario"] = "cartpole-ppo"
    add_ceilings(rows, intake)
    print(table(rows))
    for workers, plumbing in sorted(intake.items()):
        print(
            f"intake ceiling, {workers} producer(s) (rlkube bench intake --producers {workers}): "
            f"{plumbing.get('fragments_per_second', 0):,.0f} fragments/s, "
            f"{plumbing.get('env_steps_per_second', 0):,.0f} env steps/s, "
            f"rank 0 {plumbing.get('rank0_cpu_ms_per_fragment') or 0:.2f} CPU ms per fragment"
        )
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
