"""``rlkube bench weights``: from the trainer's send to every reader having the version in its model.

Scenarios: (a) trainer and readers on one node (one shm directory); (b) readers on another
"node" (their own shm directory, bytes over gRPC from the trainer process). Every reader is a
separate process that runs rollouts while it loads (``--no-rollouts``: it only loads); every
measured version is checked by fingerprint (per-parameter norms) in every reader. Peers run in
the same run: Ray's object store (numpy and torch payloads, loaded by copy as RLightning does;
plus zero-copy numpy views, which RLightning does not do), gloo broadcast (per tensor into the
parameters, or one flat buffer whose views are the parameters), a bare gRPC stream to a node
with as many rolling readers, one memcpy of the model (``memcpy-once``) and the memcpy bound
(one copy in, one out per reader). In (a) ``rlkube`` is the zero-copy publish (the trainer's
tensors live in the slot: a send flips) and ``rlkube-copy`` the same publisher packing every
version, as it does for parameters on a GPU.

    rlkube bench weights [--quick] [--json PATH] [--sizes 10MB,100MB,1GB] [--readers 1,4,8]
                         [--scenarios a,b] [--methods rlkube,ray,gloo,grpc-raw,memcpy]

Figures depend on the machine and on what else runs: the ratios, measured side by side in one
run, are what to compare. Conditions (CPUs, load average) are printed and written with --json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.weights.methods import Method, Rlkube, methods_for
from benchmarks.weights.models import SPECS, advance_, fingerprint, make_state_dict, spec_bytes
from benchmarks.weights.paired import paired_share

SIZES = {"1MB": 10**6, "4MB": 4 * 10**6, "10MB": 10**7, "100MB": 10**8, "1GB": 10**9}
ALL_METHODS = "rlkube,ray,gloo,grpc-raw,grpc-raw-copy,memcpy-once,memcpy-bound"
#: not a path RLightning takes (or a reference line of ours); shown, not used as the best peer
INFORMATIONAL = {"ray-numpy-views", "rlkube-copy", "rlkube-grpc", "memcpy-once"}
#: (scenario, method) -> a method measured in turns with it, version by version (same load)
#: Methods measured in turns with another, version by version, on a node with as many readers.
COMPANIONS = {("b", "rlkube"): ("grpc-raw", "grpc-raw-copy")}


class BenchError(RuntimeError):
    pass


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="rlkube bench weights", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="write one row per measurement to this file")
    parser.add_argument(
        "--quick", action="store_true", help="small sizes and few iterations (used by a test)"
    )
    parser.add_argument("--sizes", default="10MB,100MB,1GB", help=f"comma list of {', '.join(SIZES)}")
    parser.add_argument("--readers", default="1,4,8", help="reader counts (8 only up to 100MB)")
    parser.add_argument("--scenarios", default="a,b")
    parser.add_argument("--methods", default=ALL_METHODS, help="method names or families")
    parser.add_argument("--model", choices=sorted(SPECS), default="transformer")
    parser.add_argument("--iterations", type=int, default=5, help="measured versions per cell (3 at 1GB)")
    parser.add_argument("--warmup", type=int, default=2, help="unmeasured versions first")
    parser.add_argument(
        "--blocked-updates", type=int, default=100, help="updates for the rollout-blocked p99"
    )
    parser.add_argument(
        "--no-rollouts",
        dest="rollouts",
        action="store_false",
        help="readers do not roll out while they load: the transport alone, without the node's CPU load",
    )
    parser.add_argument("--blocked-size", default="100MB")
    parser.add_argument("--blocked-readers", type=int, default=4)
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.readers, args.iterations, args.warmup = "1MB,4MB", "2", 2, 1
        args.blocked_updates, args.blocked_size, args.blocked_readers = 20, "4MB", 2
        if args.methods == ALL_METHODS:
            args.methods = "rlkube,gloo-flat,grpc-raw,grpc-raw-copy,memcpy-once,memcpy-bound"
    for name in args.sizes.split(","):
        if name not in SIZES:
            parser.error(f"unknown size {name!r}: choose from {', '.join(SIZES)}")
    return args


def selected(name: str, names: list[str]) -> bool:
    """Whether a method is chosen by ``--methods`` (by name or by family, e.g. ``ray``)."""
    return name in names or name.split("-")[0] in names


def conditions() -> dict[str, Any]:
    try:
        import ray

        ray_version = ray.__version__
    except ImportError:
        ray_version = None
    return {
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "loadavg_at_start": os.getloadavg(),
        "torch": torch.__version__,
        "ray": ray_version,
        "python": platform.python_version(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def check(method: Method, version: int, expected: dict[str, float], got: list[dict[str, float]]) -> None:
    for i, fp in enumerate(got):
        for name, norm in expected.items():
            value = fp.get(name)
            if value is None or abs(value - norm) > 1e-5 * max(abs(norm), 1e-8):
                raise BenchError(
                    f"{method.name}: reader {i} has {name}={value} at version {version}, expected {norm}"
                )


def run_cell(
    methods: list[Method], spec: Any, state: dict, *, warmup: int, iterations: int, version: list[int]
) -> list[dict[str, Any]]:
    """One cell: started methods set up for one state dict, measured in turns ``iterations`` times.

    Several methods (rlkube and the raw gRPC stream in scenario (b)) alternate version by
    version, so that a change in the machine's load hits them alike; while one is measured, the
    other's readers pause their rollouts (each method's node carries only its own readers).
    """
    times: dict[str, list[float]] = {m.name: [] for m in methods}
    extras: dict[str, list[dict[str, float]]] = {m.name: [] for m in methods}
    net: dict[str, int] = {}
    stats: dict[str, dict[str, Any]] = {}
    ready: list[Method] = []
    try:
        for method in methods:
            method.setup(spec, state)
            ready.append(method)
        for i in range(warmup + iterations):
            for method in methods:
                if len(methods) > 1:
                    for other in methods:
                        other.on_node(other is method)
                advance_(state)
                version[0] += 1
                result = method.measure(version[0], state)
                if method.checks_fingerprint:
                    check(method, version[0], fingerprint(state), result.fingerprints)
                if i >= warmup:
                    times[method.name].append(result.seconds)
                    extras[method.name].append(result.extra)
                    net[method.name] = result.net_bytes
        stats = {m.name: m.stats() for m in methods}
    finally:
        for method in ready:
            method.teardown()
    rows = []
    for method in methods:
        median = statistics.median(times[method.name])
        row: dict[str, Any] = {
            "scenario": method.scenario,
            "method": method.name,
            "size_bytes": spec_bytes(spec),
            "readers": method.count,
            "seconds": median,
            "gbps": spec_bytes(spec) / median / 1e9,
            "iterations": times[method.name],
            "net_bytes_per_version": net[method.name],
        }
        for key in sorted({k for e in extras[method.name] for k in e}):
            row[key] = statistics.median(e[key] for e in extras[method.name] if key in e)
        fetch_seconds = stats[method.name].get("fetch_seconds")
        if fetch_seconds:
            row["fetch_seconds"] = statistics.median(fetch_seconds[-iterations:])
            row["wire_gbps"] = row["size_bytes"] / row["fetch_seconds"] / 1e9
        rows.append(row)
    return rows


def run_method(
    args: argparse.Namespace,
    scenario: str,
    name: str,
    readers: int,
    names: list[str],
    specs: dict[str, Any],
    states: dict[str, dict],
    version: list[int],
) -> list[dict[str, Any]]:
    """Start a method (with its companion, if any) for ``readers`` and measure every size."""
    methods = [next(m for m in methods_for(scenario, names) if m.name == name)]
    for companion in COMPANIONS.get((scenario, name), ()):
        if selected(companion, names):
            methods.append(next(m for m in methods_for(scenario, names) if m.name == companion))
    for method in methods:
        method.rollouts = args.rollouts
    rows: list[dict[str, Any]] = []
    for method in methods:
        method.start(readers)
    try:
        for size_name, spec in specs.items():
            size = SIZES[size_name]
            if readers > 4 and size > 10**8:
                continue
            iterations = args.iterations if size < 10**9 else min(args.iterations, 3)
            started = time.perf_counter()
            try:
                cell = run_cell(
                    methods,
                    spec,
                    states[size_name],
                    warmup=args.warmup,
                    iterations=iterations,
                    version=version,
                )
            except Exception as exc:  # record and go on: one peer failing must not lose the rest
                cell = [
                    {
                        "scenario": scenario,
                        "method": m.name,
                        "size_bytes": spec_bytes(spec),
                        "readers": readers,
                        "error": f"{type(exc).__name__}: {exc}",
                    }
                    for m in methods
                ]
            for row in cell:
                row["model"] = args.model
                shown = f"{row['seconds']:.4f}s" if "seconds" in row else row["error"][:80]
                print(
                    f"  ({scenario}) {size_name:>5s} x{row['readers']} {row['method']:22s} {shown}  "
                    f"[{time.perf_counter() - started:.0f}s]",
                    flush=True,
                )
            rows += cell
            if any("error" in row for row in cell):
                break  # the processes may be wedged: start afresh with the next reader count
    finally:
        for method in methods:
            method.stop()
    return rows


def blocked_phase(args: argparse.Namespace, version: list[int]) -> dict[str, Any]:
    spec = SPECS[args.model](SIZES[args.blocked_size])
    state = make_state_dict(spec, seed=1)
    first = next(iter(next(iter(state.values())).values()))
    method = Rlkube("a")
    method.start(args.blocked_readers)
    try:
        method.setup(spec, state)
        for _ in range(args.blocked_updates):
            version[0] += 1
            first.add_(1)
            method.measure(version[0], state)
        blocked = np.array(method.stats()["blocked"]) * 1e3
        method.teardown()
    finally:
        method.stop()
    return {
        "scenario": "a",
        "method": "rlkube-rollout-blocked",
        "size_bytes": spec_bytes(spec),
        "readers": args.blocked_readers,
        "updates": len(blocked),
        "p50_ms": float(np.percentile(blocked, 50)),
        "p99_ms": float(np.percentile(blocked, 99)),
        "max_ms": float(blocked.max()),
        "seconds": float(np.percentile(blocked, 99)) / 1e3,
        "gbps": 0.0,
    }


def fmt_bytes(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def table(rows: list[dict[str, Any]]) -> str:
    out = []
    cells: dict[tuple, list[dict]] = {}
    for row in rows:
        if "p99_ms" not in row:
            cells.setdefault((row["scenario"], row["size_bytes"], row["readers"]), []).append(row)
    for (scenario, size, readers), group in sorted(cells.items()):
        ours = next((r for r in group if r["method"] == "rlkube" and "error" not in r), None)
        out.append(f"\nscenario ({scenario})  {fmt_bytes(size)}  readers={readers}")
        out.append(
            f"  {'method':24s} {'seconds':>9s} {'GB/s':>7s} {'vs rlkube':>10s} {'net/version':>12s}  notes"
        )
        for r in group:
            if "error" in r:
                out.append(f"  {r['method']:24s} {'failed':>9s}  {r['error'][:70]}")
                continue
            ratio = f"{r['seconds'] / ours['seconds']:.2f}x" if ours else "-"
            notes = []
            if "wire_gbps" in r:
                notes.append(f"wire {r['wire_gbps']:.2f} GB/s")
            if "send_s" in r:
                notes.append(f"send() {r['send_s'] * 1e3:.1f} ms")
            if "copied_before_flip" in r:
                notes.append(f"copied before flip {fmt_bytes(r['copied_before_flip'])}")
            if "writable_s" in r:
                notes.append(f"trainer writable after {r['writable_s'] * 1e3:.0f} ms")
            if r["method"] in INFORMATIONAL:
                notes.append("not RLightning's path")
            net = fmt_bytes(r["net_bytes_per_version"]) if r.get("net_bytes_per_version") else "-"
            figures = f"{r['seconds']:9.4f} {r['gbps']:7.2f} {ratio:>10s} {net:>12s}"
            out.append(f"  {r['method']:24s} {figures}  {', '.join(notes)}")
    return "\n".join(out)


def targets(rows: list[dict[str, Any]]) -> list[str]:
    lines = []
    ok = [r for r in rows if "error" not in r and "p99_ms" not in r]
    a = [r for r in ok if r["scenario"] == "a"]
    if a:
        size = max(r["size_bytes"] for r in a)
        readers = (
            4
            if any(r["readers"] == 4 and r["size_bytes"] == size for r in a)
            else max(r["readers"] for r in a)
        )
        cell = [r for r in a if r["size_bytes"] == size and r["readers"] == readers]
        ours = next((r for r in cell if r["method"] == "rlkube"), None)
        peers = [
            r for r in cell if r["method"].startswith(("ray", "gloo")) and r["method"] not in INFORMATIONAL
        ]
        if ours and peers:
            best = min(peers, key=lambda r: r["seconds"])
            ratio = best["seconds"] / ours["seconds"]
            verdict = "PASS" if ratio >= 2 else "FAIL"
            lines.append(
                f"(a) {fmt_bytes(size)}, {readers} readers: rlkube {ours['seconds']:.3f}s, best peer "
                f"{best['method']} {best['seconds']:.3f}s -> {ratio:.2f}x faster (target >= 2x: {verdict})"
            )
            for info in (r for r in cell if r["method"] in INFORMATIONAL):
                share = info["seconds"] / ours["seconds"]
                lines.append(f"    for reference {info['method']} {info['seconds']:.3f}s ({share:.2f}x)")
        lines += zero_copy_lines(a, readers)
    b = [r for r in ok if r["scenario"] == "b"]
    if b:
        size = max(r["size_bytes"] for r in b)
        for ours in (r for r in b if r["method"] == "rlkube" and r["size_bytes"] == size):
            same_node = (r for r in b if r["size_bytes"] == size and r["readers"] == ours["readers"])
            peers = {r["method"]: r for r in same_node if r["method"].startswith("grpc-raw")}
            raw, landed = peers.get("grpc-raw"), peers.get("grpc-raw-copy")
            line = f"(b) {fmt_bytes(size)}, {ours['readers']} readers: end to end {ours['gbps']:.2f} GB/s"
            if "wire_gbps" in ours:
                verdict = "PASS" if ours["wire_gbps"] >= 1 else "FAIL"
                line += f", wire {ours['wire_gbps']:.2f} GB/s (target >= 1.0: {verdict})"
            if raw:
                wire_share = ours.get("wire_gbps", ours["gbps"]) / raw["gbps"]
                share = ours["gbps"] / raw["gbps"]
                verdict = "PASS" if share >= 0.9 else "FAIL"
                line += (
                    f"; raw gRPC to the same node {raw['gbps']:.2f} GB/s -> wire {wire_share:.0%}, "
                    f"end to end {share:.0%} of raw (target >= 90%: {verdict})"
                )
                paired = paired_share(ours["iterations"], raw["iterations"])
                line += (
                    f", per version in turns {paired.median:.0%} "
                    f"(95% interval {paired.low:.0%}-{paired.high:.0%}, {paired.pairs} pairs)"
                )
            if landed:
                line += (
                    f"; raw gRPC landing the bytes in memory {landed['gbps']:.2f} GB/s -> end to end "
                    f"{ours['gbps'] / landed['gbps']:.0%}"
                )
            net = ours["net_bytes_per_version"]
            line += f"; {fmt_bytes(net)} over the network per version for the node"
            lines.append(line)
    for r in rows:
        if "p99_ms" in r:
            verdict = "PASS" if r["p99_ms"] <= 2 else "FAIL"
            lines.append(
                f"rollout blocked per update ({fmt_bytes(r['size_bytes'])}, {r['readers']} readers, "
                f"{r['updates']} commits): p50 {r['p50_ms']:.3f} ms, p99 {r['p99_ms']:.3f} ms, "
                f"max {r['max_ms']:.3f} ms (target p99 <= 2 ms: {verdict})"
            )
    return lines


def zero_copy_lines(a: list[dict[str, Any]], readers: int) -> list[str]:
    """(a) per size: train step done -> every local reader has it, beside one memcpy and zero-copy Ray.

    At the largest size the targets: rlkube <= 1.2x one memcpy of the model, >= 2x faster than
    Ray's zero-copy variant (readers' numpy views of the object store).
    """
    lines = []
    sizes = sorted({r["size_bytes"] for r in a if r["readers"] == readers})
    for size in sizes:
        cell = {r["method"]: r for r in a if r["size_bytes"] == size and r["readers"] == readers}
        ours, memcpy, views = cell.get("rlkube"), cell.get("memcpy-once"), cell.get("ray-numpy-views")
        if ours is None:
            continue
        line = f"(a) zero-copy publish {fmt_bytes(size)}, {readers} readers: "
        line += f"rlkube {ours['seconds'] * 1e3:.1f} ms"
        if "copied_before_flip" in ours:
            line += f" ({fmt_bytes(ours['copied_before_flip'])} copied before the flip)"
        last = size == sizes[-1]
        if memcpy:
            ratio = ours["seconds"] / memcpy["seconds"]
            verdict = f" (target <= 1.2x: {'PASS' if ratio <= 1.2 else 'FAIL'})" if last else ""
            line += f"; one memcpy {memcpy['seconds'] * 1e3:.1f} ms -> {ratio:.2f}x{verdict}"
        if views:
            ratio = views["seconds"] / ours["seconds"]
            verdict = f" (target >= 2x: {'PASS' if ratio >= 2 else 'FAIL'})" if last else ""
            line += f"; zero-copy Ray {views['seconds'] * 1e3:.1f} ms -> {ratio:.2f}x faster{verdict}"
        if "rlkube-copy" in cell:
            line += f"; by copy {cell['rlkube-copy']['seconds'] * 1e3:.1f} ms"
        lines.append(line)
    return lines


def main(argv: list[str]) -> int:
    args = parse(argv)
    torch.set_num_threads(1)  # every copy single-threaded (intra-op threads thrash on a busy 2-core box)
    names = [n for n in args.methods.split(",") if n]
    env = conditions()
    print(
        f"rlkube bench weights: {env['cpus']} CPUs, load average {env['loadavg_at_start']}, "
        f"torch {env['torch']}, ray {env['ray'] or 'not installed (pip install -e .[bench])'}",
        flush=True,
    )
    wants_ray = any(n.startswith("ray") for n in names)
    ray = None
    if wants_ray:
        try:
            import ray as ray_module

            largest = max(SIZES[s] for s in args.sizes.split(","))
            ray_module.init(
                num_cpus=os.cpu_count(),
                object_store_memory=int(min(max(3 * largest, 1 << 30), 8 << 30)),
                include_dashboard=False,
                logging_level="ERROR",
                log_to_driver=False,
            )
            ray = ray_module
        except ImportError:
            print("ray is not installed: Ray rows are skipped (pip install -e .[bench])", flush=True)
    rows: list[dict[str, Any]] = []
    version = [0]
    sizes = args.sizes.split(",")
    specs = {name: SPECS[args.model](SIZES[name]) for name in sizes}
    states = {name: make_state_dict(spec) for name, spec in specs.items()}
    reader_counts = [int(r) for r in args.readers.split(",")]
    try:
        for scenario in args.scenarios.split(","):
            for name in [m.name for m in methods_for(scenario, names)]:
                if name.startswith("ray") and ray is None:
                    continue
                partners = [p for (sc, p), cs in COMPANIONS.items() if sc == scenario and name in cs]
                partner = partners[0] if partners else None
                if partner and selected(partner, names):
                    continue  # measured in turns with its partner, on a node with as many readers
                for readers in reader_counts:
                    rows += run_method(args, scenario, name, readers, names, specs, states, version)
        states.clear()
        if args.blocked_updates and "rlkube" in [n.split("-")[0] for n in names]:
            rows.append(blocked_phase(args, version))
    finally:
        if ray is not None:
            ray.shutdown()
    env["loadavg_at_end"] = os.getloadavg()
    env["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(table(rows))
    print()
    for line in targets(rows):
        print(line)
    print(f"\nconditions: {json.dumps(env)}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"conditions": env, "rows": rows}, indent=1))
        print(f"wrote {len(rows)} rows to {args.json}")
    failed = [r for r in rows if "error" in r and r["method"].startswith("rlkube")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
