"""``rlkube bench sharded``: Sharded over train ranks on separate nodes vs one stream, same run.

Three "nodes", each a network namespace of its own (:func:`rlkube.launch.netns.link_local_nodes`:
veth pairs into a bridge, link-local addresses, all removed afterwards): train ranks 0 and 1
each run a :class:`~rlkube.weights.publisher.WeightPublisher` serving the same weights under one
incarnation (rank 0 announces rank 1 as a source), and a receiver on the third node runs a
:class:`~rlkube.weights.receiver.NodeReceiver` into its own shm buffer. Versions alternate
between the two ways of fetching, both ranks publishing each version before it is fetched:

* ``one-stream``: one range stream from rank 0 (the Shared strategy's fetch);
* ``sharded-xN``: ``N`` range streams spread over both ranks (the Sharded strategy).

``--modes fetch``: both ranks publish a version, then the receiver fetches it; its whole
``apply`` is timed (network, per-chunk checks, the copy into the slot, the whole-version checksum
against the trainer's, the flip). ``end-to-end``: the receiver's own thread follows rank 0 as an
eval node's does, fetching while the ranks pack; timed from telling both ranks to publish to the
receiver's flip. Optionally every rank's outbound link is rate-limited (``tc`` token bucket,
``--links 400mbit``): one stream then gets about one link, the Sharded fetch about one per rank.
Needs root (it refuses otherwise). The node processes are :mod:`benchmarks.weights.netns_nodes`.

    rlkube bench sharded [--sizes 100MB,1GB] [--links unlimited,400mbit] [--iterations 4]
                         [--modes fetch,end-to-end] [--warmup 1] [--streams 2] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from rlkube.launch.netns import NetnsError, unavailable_reason

from benchmarks.weights.netns_nodes import NodeError, ShardedNodes, sharded_nodes

SIZES = {"4MB": 4 * 10**6, "10MB": 10**7, "100MB": 10**8, "1GB": 10**9}


class BenchError(RuntimeError):
    """A version that did not arrive, or arrived with another checksum than the trainer's."""


@dataclass(frozen=True)
class Row:
    mode: str
    size: str
    link: str
    method: str
    seconds: list[float]
    #: Share of the fetched bytes each rank served.
    shares: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    def line(self, nbytes: int) -> str:
        shares = ", ".join(f"rank{i} {100 * s:.0f}%" for i, s in enumerate(self.shares))
        return (
            f"  {self.mode:10s} {self.size:>5s} link {self.link:>9s}  {self.method:12s}"
            f" {self.median:7.3f} s/version  {nbytes / self.median / 1e6:8.1f} MB/s"
            f"   ({shares}; {len(self.seconds)} versions)"
        )


def burst_for(rate: str) -> str:
    """A token bucket of about 4 ms of ``rate`` (at least 64 KiB: one GSO packet)."""
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
    for unit, scale in units.items():
        if rate.endswith(unit):
            bits = float(rate[: -len(unit)]) * scale
            return f"{max(64 * 1024, int(bits / 8 * 0.004))}b"
    raise BenchError(f"link rate {rate!r}: write it as Nkbit, Nmbit or Ngbit")


def measure(
    nodes: ShardedNodes, *, mode: str, size: str, link: str, streams: int, iterations: int, version: int
) -> tuple[list[Row], int, int]:
    """Alternate one-stream and Sharded (ABBA), one new version each; returns the rows, the last
    version used and the bytes of a version.

    ``fetch``: both ranks publish, then the receiver fetches (its ``apply`` is timed). ``end-to-end``
    (a ``follow`` receiver): from telling both ranks to publish to the receiver having the version
    in its buffer, as in a run: fetched while the ranks pack it.
    """
    nbytes = 0
    methods = {"one-stream": 1, f"sharded-x{streams}": streams}
    seconds: dict[str, list[float]] = {m: [] for m in methods}
    served: dict[str, list[int]] = {m: [0, 0] for m in methods}
    order = list(methods)
    for i in range(iterations):
        for method in order if i % 2 == 0 else order[::-1]:
            version += 1
            nodes.prepare(version)
            before = nodes.served()
            if mode == "fetch":
                published = nodes.publish(version)
                answer = nodes.receiver.ask(op="fetch", version=version, streams=methods[method], timeout=900)
                took = float(answer["seconds"])
            else:
                nodes.receiver.ask(op="streams", streams=methods[method], timeout=30)
                started = time.perf_counter()
                published = nodes.publish(version)
                answer = nodes.receiver.ask(op="wait", version=version, seconds=900.0, timeout=960)
                took = time.perf_counter() - started
                if answer["version"] != version:
                    raise BenchError(f"version {version} did not arrive: {answer['errors']}")
            if answer["checksum"] != published[0]["checksum"]:
                raise BenchError(f"version {version}: receiver has checksum {answer['checksum']:x}")
            after = nodes.served()
            seconds[method].append(took)
            served[method] = [s + a - b for s, a, b in zip(served[method], after, before, strict=True)]
            nbytes = int(published[0]["total_bytes"])
    rows = []
    for method in methods:
        total = sum(served[method]) or 1
        rows.append(Row(mode, size, link, method, seconds[method], [s / total for s in served[method]]))
    return rows, version, nbytes


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="rlkube bench sharded", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100MB", help=f"comma list of {', '.join(SIZES)}")
    parser.add_argument(
        "--links", default="unlimited,400mbit", help="comma list: unlimited, or a tc rate per rank link"
    )
    parser.add_argument(
        "--modes",
        default="fetch,end-to-end",
        help="fetch (of committed versions), end-to-end (publish to flip)",
    )
    parser.add_argument("--iterations", type=int, default=4, help="versions per method and cell")
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured versions per method first")
    parser.add_argument("--streams", type=int, default=2, help="range streams of the Sharded fetch")
    parser.add_argument("--model", default="transformer", choices=["transformer", "mlp"])
    parser.add_argument("--json", type=Path, help="write the rows to this file")
    args = parser.parse_args(argv)
    for name in args.sizes.split(","):
        if name not in SIZES:
            parser.error(f"unknown size {name!r}: choose from {', '.join(SIZES)}")
    for mode in args.modes.split(","):
        if mode not in ("fetch", "end-to-end"):
            parser.error(f"unknown mode {mode!r}: fetch or end-to-end")
    for link in args.links.split(","):
        if link != "unlimited":
            try:
                burst_for(link)
            except BenchError as exc:
                parser.error(str(exc))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(list(sys.argv[1:] if argv is None else argv))
    reason = unavailable_reason()
    if reason is not None:
        print(f"rlkube bench sharded: cannot run: {reason} (it makes network namespaces and veth pairs)",
              file=sys.stderr)  # fmt: skip
        return 2
    load_before = os.getloadavg()
    print(f"rlkube bench sharded: {os.cpu_count()} CPUs, load average {_load(load_before)}")
    print("  ranks 0, 1 and the receiver on 3 namespaced nodes; MB/s = model bytes / time per version;")
    print("  fetch: the receiver's fetch (network, checks, copy, checksum, flip) of a committed version;")
    print("  end-to-end: from both ranks told to publish to the receiver's flip (fetched while packed)")
    rows: list[Row] = []
    try:
        for size in args.sizes.split(","):
            for mode in args.modes.split(","):
                rows += run_cell(args, size=size, mode=mode)
    except (NetnsError, NodeError, BenchError) as exc:
        print(f"rlkube bench sharded: {exc}", file=sys.stderr)
        return 1
    load_after = os.getloadavg()
    cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_seconds = cpu.ru_utime + cpu.ru_stime
    print(f"  load average after: {_load(load_after)}; CPU of the node processes {cpu_seconds:.0f} s")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "cpus": os.cpu_count(),
                    "load_before": load_before,
                    "load_after": load_after,
                    "rows": [row.__dict__ for row in rows],
                },
                indent=1,
            )
        )
    return 0


def run_cell(args: argparse.Namespace, *, size: str, mode: str) -> list[Row]:
    """One size in one mode, over every link setting (one set of node processes)."""
    rows: list[Row] = []
    receiver_mode = "on-demand" if mode == "fetch" else "follow"
    with sharded_nodes(size=SIZES[size], mode=receiver_mode, streams=args.streams, model=args.model) as nodes:
        # Unmeasured versions first, each way: the receiver creates and touches each slot's pages
        # on its first version (a second or more for 100 MB on a busy machine), the streams connect.
        _, version, _ = measure(
            nodes, mode=mode, size=size, link="unlimited", streams=args.streams, iterations=args.warmup,
            version=0,
        )  # fmt: skip
        for link in args.links.split(","):
            for rank in range(2):
                nodes.net.unshape(rank)
                if link != "unlimited":
                    nodes.net.shape(rank, rate=link, burst=burst_for(link))
            cell, version, nbytes = measure(
                nodes, mode=mode, size=size, link=link, streams=args.streams, iterations=args.iterations,
                version=version,
            )  # fmt: skip
            for row in cell:
                print(row.line(nbytes), flush=True)
            print(f"  {mode:10s} {size:>5s} link {link:>9s}  sharded / one stream: "
                  f"{cell[0].median / cell[1].median:.2f}x the throughput", flush=True)  # fmt: skip
            rows += cell
    return rows


def _load(load: tuple[float, float, float]) -> str:
    return ", ".join(f"{x:.2f}" for x in load)


if __name__ == "__main__":
    sys.exit(main())
