"""The node processes of ``rlkube bench sharded`` and the caller's handle on them.

I/O (processes, network namespaces, shm). :func:`sharded_nodes` makes three namespaced nodes
(:func:`rlkube.launch.netns.link_local_nodes`) and starts, under ``ip netns exec``: train ranks 0
and 1 (``python -m benchmarks.weights.netns_nodes rank``), each a
:class:`~rlkube.weights.publisher.WeightPublisher` of the same deterministic weights under one
incarnation (rank 0 announces rank 1 as a source), and a receiver
(``... receiver``), a :class:`~rlkube.weights.receiver.NodeReceiver` into its own buffer:
``follow`` runs the receiver's own thread (watching rank 0 as an eval node's does),
``on-demand`` fetches one committed version per command. They answer JSON lines on stdin with
``@reply {...}`` lines on stdout; everything stops and is removed on exit.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

from rlkube.launch.netns import LinkLocalNodes, link_local_nodes

PORT = 50052
REPLY = "@reply "
CHUNK_BYTES = 1 << 20
#: What the node processes run (``python -m MODULE ROLE ...``).
MODULE = "benchmarks.weights.netns_nodes"


class NodeError(RuntimeError):
    """A node process that did not answer (its log's tail is in the message)."""


# -- the processes on the nodes (``python -m benchmarks.weights.netns_nodes ROLE ...``)


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
        data_listen=f"{args.address}:0",  # the product's default transport; found over gRPC
        advertise=f"{args.address}:{PORT}",
        peers=tuple(args.peers.split(",")) if args.peers else (),
        incarnation=args.incarnation,
        chunk_bytes=args.chunk_bytes,
    )
    with WeightPublisher(config) as publisher:
        current = 0
        _reply(ready=True, address=publisher.address)
        for command in _commands():
            if command["op"] == "prepare":  # the training step: the weights of ``version``
                version = int(command["version"])
                for _ in range(version - current):
                    advance_(state)
                current = version
                _reply(prepared=version)
            elif command["op"] == "publish":
                version = int(command["version"])
                if version != current:
                    raise RuntimeError(f"publish {version}: prepare it first (the weights are {current}'s)")
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
                elif command["op"] == "streams":  # follow: the next fetches use this many
                    receiver.config = replace(config, streams=int(command["streams"]))
                    _reply(streams=receiver.config.streams)
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
                        fetch_seconds=receiver.stats.fetch_seconds[-1:],
                    )
    finally:
        watcher.close()
        receiver.close()
    return 0


def _notify(changed: threading.Condition) -> None:
    with changed:
        changed.notify_all()


def node_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.weights.netns_nodes")
    parser.add_argument("role", choices=["rank", "receiver"])
    parser.add_argument("--shm-dir", required=True)
    parser.add_argument("--incarnation", required=True)
    parser.add_argument("--address", default="")
    parser.add_argument("--peers", default="")
    parser.add_argument("--source", default="")
    parser.add_argument("--size", type=int, default=0, help="model bytes (ranks)")
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
            ["ip", "netns", "exec", namespace, sys.executable, "-m", MODULE, *argv],
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
            raise NodeError(
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

    def prepare(self, version: int, *, timeout: float = 300.0) -> None:
        """Both ranks compute the weights of ``version`` (a stand-in for the training step)."""
        for rank in self.ranks:
            rank.send(op="prepare", version=version)
        for rank in self.ranks:
            rank.reply(timeout=timeout)

    def publish(self, version: int, *, timeout: float = 300.0) -> list[dict[str, Any]]:
        """Both ranks publish ``version`` (at once, as after one DDP step; :meth:`prepare` it
        first); their answers."""
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


if __name__ == "__main__":
    sys.exit(node_main(sys.argv[1:]))
