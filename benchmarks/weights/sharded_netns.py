"""``rlkube bench sharded``: Sharded over train ranks on separate nodes vs one stream, same run.

Three "nodes", each a network namespace of its own (:func:`rlkube.launch.netns.link_local_nodes`:
veth pairs into a bridge, link-local addresses, all removed afterwards): train ranks 0 and 1
each run a :class:`~rlkube.weights.publisher.WeightPublisher` serving the same weights under one
incarnation (rank 0 announces rank 1 as a source), and a receiver on the third node runs a
:class:`~rlkube.weights.receiver.NodeReceiver` into its own shm buffer. Versions alternate
between the two ways of fetching, both ranks publishing each version before it is fetched:

* ``one-stream``: one range stream from rank 0 (the Shared strategy's fetch);
* ``sharded-xN``: ``N`` range streams spread over both ranks (the Sharded strategy).

Each fetch is the receiver's whole ``apply``: network, per-chunk checks, the copy into the slot
and the whole-version checksum against the trainer's, then the flip. Optionally every rank's
outbound link is rate-limited (``tc`` token bucket, ``--links 400mbit``): one stream then gets
about one link, the Sharded fetch about one per rank. Needs root (it refuses otherwise).

    rlkube bench sharded [--sizes 100MB,1GB] [--links unlimited,400mbit] [--iterations 3]
                         [--streams 2] [--json PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import resource
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

from rlkube.launch.netns import LinkLocalNodes, NetnsError, link_local_nodes, unavailable_reason

SIZES = {"4MB": 4 * 10**6, "10MB": 10**7, "100MB": 10**8, "1GB": 10**9}
#: The WeightStore port of every rank (each node has a port space of its own).
PORT = 50052
REPLY = "@reply "
CHUNK_BYTES = 1 << 20
#: What the node processes run (``python -m MODULE node ...``).
MODULE = "benchmarks.weights.sharded_netns"


class BenchError(RuntimeError):
    pass


# -- the processes on the nodes (``python -m benchmarks.weights.sharded_netns node ...``)


def _reply(**fields: Any) -> None:
    sys.stdout.write(REPLY + json.dumps(fields) + "\n")
    sys.stdout.flush()


def _commands() -> Iterator[dict[str, Any]]:
    for line in sys.stdin:
        if line.strip():
            command: dict[str, Any] = json.loads(line)
            if command["op"] == "exit":
                return
            yield command


def run_rank(args: argparse.Namespace) -> int:
    """A train rank: publishes version v of the deterministic weights when told to."""
    from rlkube.weights.publisher import PublisherConfig, WeightPublisher

    from benchmarks.weights.models import SPECS, advance_, make_state_dict

    state = make_state_dict(SPECS[args.model](args.size), seed=args.seed)
    config = PublisherConfig(
        shm_dir=Path(args.shm_dir),
        listen=f"{args.address}:{PORT}",
        advertise=f"{args.address}:{PORT}",
        peers=tuple(args.peers.split(",")) if args.peers else (),
        incarnation=args.incarnation,
        chunk_bytes=args.chunk_bytes,
    )
    with WeightPublisher(config) as publisher:
        current = 0
        _reply(ready=True, address=publisher.address)
        for command in _commands():
            if command["op"] == "publish":
                version = int(command["version"])
                for _ in range(version - current):
                    advance_(state)
                current = version
                started = time.perf_counter()
                publisher.send(state, version=version)
                latest = publisher.latest()
                assert latest is not None
                _reply(
                    version=version,
                    seconds=time.perf_counter() - started,
                    checksum=latest.checksum,
                    total_bytes=latest.total_bytes,
                )
            elif command["op"] == "stats":
                _reply(served=publisher.board.stats.bytes, fetches=publisher.board.stats.fetches)
    return 0


def run_receiver(args: argparse.Namespace) -> int:
    """The receiver node: ``follow`` runs the elected receiver's own thread (watching rank 0 while
    it packs); ``on-demand`` fetches one committed version per ``fetch`` command, with ``streams``."""
    from rlkube.weight_key import WeightKey
    from rlkube.weights.client import WeightStoreClient
    from rlkube.weights.receiver import NodeReceiver, ReceiverConfig
    from rlkube.weights.sources import ShmWatcher

    config = ReceiverConfig(
        shm_dir=Path(args.shm_dir),
        source=args.source,
        streams=args.streams,
        worker_id="bench-receiver",
        node_name="node-2",
        rpc_timeout=600.0,  # a fetch's deadline is this plus size / 50 MB/s: slow links too
        slot_wait_timeout=120.0,
    )
    config.shm_dir.mkdir(parents=True, exist_ok=True)
    receiver = NodeReceiver(config)
    changed = threading.Condition()
    watcher = ShmWatcher(config.shm_dir, lambda: _notify(changed))
    if args.mode == "follow":
        receiver.start()
    else:
        receiver.writer.open()
    watcher.start()
    try:
        _reply(ready=True)
        with WeightStoreClient(args.source, rpc_timeout=60.0) as client:
            for command in _commands():
                if command["op"] == "fetch":  # on-demand
                    version = int(command["version"])
                    announced = next(
                        v
                        for v in client.watch(after=WeightKey(args.incarnation, version - 1), seconds=30.0)
                        if v.version == version
                    )
                    receiver.config = replace(config, streams=int(command["streams"]))
                    started = time.perf_counter()
                    meta = receiver.apply(announced)
                    _reply(
                        version=meta.version, seconds=time.perf_counter() - started, checksum=meta.checksum
                    )
                elif command["op"] == "wait":  # follow
                    version, deadline = int(command["version"]), time.monotonic() + float(command["seconds"])
                    with changed:
                        while (latest := receiver.writer.latest()) is None or latest.version < version:
                            if not changed.wait(max(0.0, deadline - time.monotonic())):
                                break
                    _reply(
                        version=latest.version if latest else 0,
                        checksum=latest.checksum if latest else 0,
                        errors=receiver.stats.errors,
                    )
    finally:
        watcher.close()
        receiver.close()
    return 0


def _notify(changed: threading.Condition) -> None:
    with changed:
        changed.notify_all()


def node_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="sharded_netns node")
    parser.add_argument("role", choices=["rank", "receiver"])
    parser.add_argument("--shm-dir", required=True)
    parser.add_argument("--incarnation", required=True)
    parser.add_argument("--address", default="")
    parser.add_argument("--peers", default="")
    parser.add_argument("--source", default="")
    parser.add_argument("--size", type=int, default=SIZES["4MB"])
    parser.add_argument("--model", default="transformer")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--chunk-bytes", type=int, default=CHUNK_BYTES)
    parser.add_argument("--streams", type=int, default=2)
    parser.add_argument("--mode", choices=["follow", "on-demand"], default="on-demand")
    args = parser.parse_args(argv)
    return run_rank(args) if args.role == "rank" else run_receiver(args)


# -- the orchestrator (in the caller's namespace)


class NodeProcess:
    """A node's process under ``ip netns exec``, driven by JSON lines (its stderr goes to ``log``)."""

    def __init__(self, namespace: str, argv: list[str], *, log: Path) -> None:
        self.log = log
        self._log_file: IO[bytes] = log.open("wb")
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", namespace, sys.executable, "-m", MODULE, "node", *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log_file,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self._replies: queue.Queue[dict[str, Any] | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(REPLY):
                self._replies.put(json.loads(line[len(REPLY) :]))
        self._replies.put(None)

    def send(self, **command: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()

    def reply(self, *, timeout: float) -> dict[str, Any]:
        try:
            answer = self._replies.get(timeout=timeout)
        except queue.Empty:
            answer = None
        if answer is None:
            tail = self.log.read_text(errors="replace")[-3000:]
            raise BenchError(
                f"{self.log.stem}: no answer within {timeout:.0f} s (exit {self.proc.poll()}):\n{tail}"
            )
        return answer

    def ask(self, *, timeout: float, **command: Any) -> dict[str, Any]:
        self.send(**command)
        return self.reply(timeout=timeout)

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(BrokenPipeError, OSError):
                self.send(op="exit")
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log_file.close()


@dataclass
class ShardedNodes:
    """Two train ranks and a receiver on three namespaced nodes (see the module docstring)."""

    net: LinkLocalNodes
    ranks: tuple[NodeProcess, ...]
    receiver: NodeProcess
    receiver_dir: Path
    incarnation: str

    def publish(self, version: int, *, timeout: float = 300.0) -> list[dict[str, Any]]:
        """Both ranks publish ``version`` (at once, as after one DDP step); their answers."""
        for rank in self.ranks:
            rank.send(op="publish", version=version)
        return [rank.reply(timeout=timeout) for rank in self.ranks]

    def served(self) -> list[int]:
        """Bytes each rank has served so far."""
        return [int(rank.ask(op="stats", timeout=30)["served"]) for rank in self.ranks]


@contextlib.contextmanager
def sharded_nodes(
    *,
    size: int,
    mode: str = "on-demand",
    streams: int = 2,
    model: str = "transformer",
    chunk_bytes: int = CHUNK_BYTES,
    workdir: Path | None = None,
) -> Iterator[ShardedNodes]:
    """Three namespaced nodes with their processes up; everything stopped and removed on exit.

    Raises :class:`~rlkube.launch.netns.NetnsUnavailable` where namespaces cannot be made.
    """
    with contextlib.ExitStack() as stack:
        net = stack.enter_context(link_local_nodes(3, prefix="rlks"))
        shm = Path(
            tempfile.mkdtemp(prefix="rlk-sharded-", dir="/dev/shm" if Path("/dev/shm").is_dir() else None)
        )
        stack.callback(shutil.rmtree, shm, True)
        logs = workdir or shm
        incarnation = f"bench-{secrets.token_hex(4)}"
        ranks_at = [f"{node.address}:{PORT}" for node in net.nodes[:2]]
        common = ["--incarnation", incarnation, "--chunk-bytes", str(chunk_bytes)]
        processes: list[NodeProcess] = []
        try:
            for i in range(2):
                peers = ranks_at[1] if i == 0 else ""
                argv = ["rank", "--shm-dir", str(shm / f"rank{i}"), "--address", net.nodes[i].address,
                        "--peers", peers, "--size", str(size), "--model", model, *common]  # fmt: skip
                processes.append(NodeProcess(net.namespaces[i], argv, log=logs / f"rank{i}.log"))
            argv = ["receiver", "--shm-dir", str(shm / "receiver"), "--source", ranks_at[0],
                    "--streams", str(streams), "--mode", mode, *common]  # fmt: skip
            processes.append(NodeProcess(net.namespaces[2], argv, log=logs / "receiver.log"))
            for process in processes:
                process.reply(timeout=600)  # importing torch on a busy machine takes a while
            yield ShardedNodes(
                net=net,
                ranks=tuple(processes[:2]),
                receiver=processes[2],
                receiver_dir=shm / "receiver",
                incarnation=incarnation,
            )
        finally:
            for process in processes:
                process.close()


@dataclass(frozen=True)
class Row:
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
            f"  {self.size:>6s} link {self.link:>9s}  {self.method:12s} {self.median:8.3f} s/version"
            f"  {nbytes / self.median / 1e6:8.1f} MB/s   ({shares}; {len(self.seconds)} versions)"
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
    nodes: ShardedNodes, *, size: str, link: str, streams: int, iterations: int, version: int
) -> tuple[list[Row], int, int]:
    """Alternate one-stream and Sharded fetches (ABBA), one new version each; returns the rows, the
    last version used and the bytes of a version."""
    nbytes = 0
    methods = {"one-stream": 1, f"sharded-x{streams}": streams}
    seconds: dict[str, list[float]] = {m: [] for m in methods}
    served: dict[str, list[int]] = {m: [0, 0] for m in methods}
    order = list(methods)
    for i in range(iterations):
        for method in order if i % 2 == 0 else order[::-1]:
            version += 1
            published = nodes.publish(version)
            before = nodes.served()
            answer = nodes.receiver.ask(op="fetch", version=version, streams=methods[method], timeout=900)
            if answer["checksum"] != published[0]["checksum"]:
                raise BenchError(f"version {version}: receiver has checksum {answer['checksum']:x}")
            after = nodes.served()
            seconds[method].append(float(answer["seconds"]))
            served[method] = [s + a - b for s, a, b in zip(served[method], after, before, strict=True)]
            nbytes = int(published[0]["total_bytes"])
    rows = []
    for method in methods:
        total = sum(served[method]) or 1
        rows.append(Row(size, link, method, seconds[method], [s / total for s in served[method]]))
    return rows, version, nbytes


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="rlkube bench sharded", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100MB", help=f"comma list of {', '.join(SIZES)}")
    parser.add_argument(
        "--links", default="unlimited,400mbit", help="comma list: unlimited, or a tc rate per rank link"
    )
    parser.add_argument("--iterations", type=int, default=4, help="versions per method and cell")
    parser.add_argument("--streams", type=int, default=2, help="range streams of the Sharded fetch")
    parser.add_argument("--model", default="transformer", choices=["transformer", "mlp"])
    parser.add_argument("--json", type=Path, help="write the rows to this file")
    args = parser.parse_args(argv)
    for name in args.sizes.split(","):
        if name not in SIZES:
            parser.error(f"unknown size {name!r}: choose from {', '.join(SIZES)}")
    for link in args.links.split(","):
        if link != "unlimited":
            try:
                burst_for(link)
            except BenchError as exc:
                parser.error(str(exc))
    return args


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "node":
        return node_main(argv[1:])
    args = parse(argv)
    reason = unavailable_reason()
    if reason is not None:
        print(f"rlkube bench sharded: cannot run: {reason} (it makes network namespaces and veth pairs)",
              file=sys.stderr)  # fmt: skip
        return 2
    load_before = os.getloadavg()
    print(f"rlkube bench sharded: {os.cpu_count()} CPUs, load average {_load(load_before)}")
    print("  time per version: the receiver's fetch (network, checks, copy, checksum, flip) after both")
    print("  ranks committed it; MB/s = model bytes / that time; ranks and receiver on 3 namespaced nodes")
    rows: list[Row] = []
    try:
        for size in args.sizes.split(","):
            with sharded_nodes(size=SIZES[size], streams=args.streams, model=args.model) as nodes:
                version = 0
                for link in args.links.split(","):
                    for rank in range(2):
                        nodes.net.unshape(rank)
                        if link != "unlimited":
                            nodes.net.shape(rank, rate=link, burst=burst_for(link))
                    cell, version, nbytes = measure(
                        nodes, size=size, link=link, streams=args.streams, iterations=args.iterations,
                        version=version,
                    )  # fmt: skip
                    for row in cell:
                        print(row.line(nbytes), flush=True)
                    print(f"  {size:>6s} link {link:>9s}  sharded / one stream: "
                          f"{cell[0].median / cell[1].median:.2f}x the throughput", flush=True)  # fmt: skip
                    rows += cell
    except (NetnsError, BenchError) as exc:
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


def _load(load: tuple[float, float, float]) -> str:
    return ", ".join(f"{x:.2f}" for x in load)


if __name__ == "__main__":
    sys.exit(main())
