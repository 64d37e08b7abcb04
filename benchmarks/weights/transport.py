"""``rlkube bench transport``: the weight fetch alone against a raw gRPC stream, no readers, no packing.

A server process publishes one version (committed, so nothing is packed or hashed while it is
fetched) and serves the same bytes as a bare gRPC stream. The client process fetches in turns,
round by round: ``WeightStoreClient.fetch_into`` over the weight data port (``rlkube``: every
chunk checked and received straight into the buffer) and over gRPC (``rlkube-grpc``: checked,
then copied out of its message), the raw stream discarding the bytes, and the raw stream copying
them into a buffer.
What separates rlkube from the copying raw stream is its own overhead; what separates the two
raw streams is the one copy any receiver that keeps the bytes makes. Two plain TCP streams read
with ``recv_into`` straight into the buffer (``tcp-recv-into``, and ``tcp-recv-into-xxh3`` with
rlkube's per-chunk check) show what a transport without gRPC's own copies reaches.

    rlkube bench transport [--megabytes 100] [--rounds 20] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def serve(megabytes: int, queue: Any) -> None:
    """The server process: a WeightPublisher with one committed version, and the raw stream."""
    import torch
    from rlkube.weights.layout import layout_of, pack_into_
    from rlkube.weights.publisher import PublisherConfig, WeightPublisher

    from benchmarks.weights.raw_stream import RawTcpServer, serve_raw_stream

    torch.set_num_threads(1)
    tensors = max(1, megabytes // 4)
    state = {"model": {f"w{i}": torch.randn(1 << 20) for i in range(tensors)}}  # 4 MiB each
    directory = Path("/dev/shm") / f"rlkube-bench-transport-{os.getpid()}"
    config = PublisherConfig(shm_dir=directory, listen="127.0.0.1:0", data_listen="127.0.0.1:0")
    publisher = WeightPublisher(config).connect()
    publisher.send(state, version=1)
    layout = layout_of(state)
    flat = torch.empty(layout.total_bytes, dtype=torch.uint8)
    pack_into_(flat, state, layout)
    server, port = serve_raw_stream(memoryview(flat.numpy().data))
    tcp = RawTcpServer(memoryview(flat.numpy().data))
    try:
        queue.put((publisher.address, f"127.0.0.1:{port}", f"127.0.0.1:{tcp.port}"))
        queue.get()  # until the client is done
    finally:
        tcp.close()
        server.stop(0).wait()
        publisher.close()
        shutil.rmtree(directory, ignore_errors=True)


def measure(addresses: tuple[str, str, str], rounds: int) -> dict[str, list[float]]:
    """The client: every method once per round, in turns; seconds per fetch."""
    import numpy as np
    from rlkube.weights.client import WeightStoreClient

    from benchmarks.weights.raw_stream import RawStreamReceiver, RawTcpReceiver

    store, raw, tcp_address = addresses
    with (
        WeightStoreClient(store).connect() as client,
        WeightStoreClient(store, use_data_port=False).connect() as over_grpc,
    ):
        version = next(iter(client.watch(after=None, seconds=10)))
        dst = np.zeros(version.total_bytes, dtype=np.uint8)
        stream = RawStreamReceiver(raw)
        tcp = RawTcpReceiver(tcp_address, version.total_bytes)
        methods: dict[str, Callable[[], object]] = {
            "rlkube": lambda: client.fetch_into(version, dst, while_packing=False),
            "rlkube-grpc": lambda: over_grpc.fetch_into(version, dst, while_packing=False),
            "grpc-raw": stream.receive,
            "grpc-raw-copy": lambda: stream.receive(dst),
            "tcp-recv-into": lambda: tcp.receive(dst),
            "tcp-recv-into-xxh3": lambda: tcp.receive(dst, digest=True),
        }
        times: dict[str, list[float]] = {name: [] for name in methods}
        try:
            for _ in range(rounds + 1):  # the first round warms up
                for name, fetch in methods.items():
                    started = time.perf_counter()
                    fetch()
                    times[name].append(time.perf_counter() - started)
        finally:
            stream.close()
            tcp.close()
    return {name: seconds[1:] for name, seconds in times.items()}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="rlkube bench transport", description=__doc__.split("\n")[0])
    parser.add_argument("--megabytes", type=int, default=100, help="model size (MiB, in 4 MiB tensors)")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--json", type=Path, help="write the figures to this file")
    args = parser.parse_args(argv)
    started = os.getloadavg()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    server = ctx.Process(target=serve, args=(args.megabytes, queue), daemon=True)
    server.start()
    try:
        times = measure(queue.get(timeout=120), args.rounds)
    finally:
        queue.put("done")
        server.join(30)
        if server.is_alive():
            server.kill()
    size = args.megabytes * (1 << 20)
    print(f"rlkube bench transport: {size / 1e6:.1f} MB, {args.rounds} rounds, 2 processes, load {started}")
    medians = {name: statistics.median(seconds) for name, seconds in times.items()}
    for name, median in medians.items():
        print(
            f"  {name:18s} median {median * 1e3:7.1f} ms  {size / median / 1e9:5.2f} GB/s  "
            f"rlkube's rate is {medians[name] / medians['rlkube']:.0%} of this"
        )
    conditions = {"cpus": os.cpu_count(), "loadavg_at_start": started, "loadavg_at_end": os.getloadavg()}
    if args.json:
        args.json.write_text(json.dumps({"conditions": conditions, "size_bytes": size, "seconds": times}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
