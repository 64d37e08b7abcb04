"""The trainer side of every method in ``rlkube bench weights``, one class each.

A method is started for one (state-dict spec, number of readers), measured for several
versions, then stopped. ``measure(version, state_dict)`` returns the seconds from the trainer
starting to send until the *last* reader has the version in its model, plus what the readers
report (their load times and fingerprints, checked by run.py).
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import shutil
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rlkube.weights.layout import layout_of, pack_into_
from rlkube.weights.publisher import PublisherConfig, WeightPublisher

from benchmarks.weights.models import Spec
from benchmarks.weights.raw_stream import serve_raw_stream
from benchmarks.weights.readers import RayReader, reader_process

StateDict = dict[str, dict[str, torch.Tensor]]
SHM_ROOT = Path("/dev/shm")


@dataclass
class Result:
    seconds: float
    fingerprints: list[dict[str, float]] = field(default_factory=list)
    net_bytes: int = 0
    extra: dict[str, float] = field(default_factory=dict)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ProcessReaders:
    """N reader processes (spawned) driven over pipes."""

    def __init__(self, kind: str, count: int) -> None:
        ctx = mp.get_context("spawn")
        self.conns = []
        self.procs = []
        for _ in range(count):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=reader_process, args=(child, kind), daemon=True)
            proc.start()
            self.conns.append(parent)
            self.procs.append(proc)

    def setup(self, configs: list[dict[str, Any]]) -> None:
        """Send every reader its setup (they build concurrently); then call wait_ready()."""
        for conn, config in zip(self.conns, configs, strict=True):
            conn.send(("setup", config))

    def teardown(self) -> None:
        for conn in self.conns:
            conn.send(("teardown", None))
        for conn in self.conns:
            self._recv(conn, "down")

    def _recv(self, conn: Any, expect: str, timeout: float = 600.0) -> Any:
        if not conn.poll(timeout):
            raise TimeoutError(f"reader sent no {expect!r} within {timeout}s")
        message = conn.recv()
        if message[0] == "error":
            raise RuntimeError(f"reader failed: {message[1]}")
        if message[0] != expect:
            raise RuntimeError(f"reader sent {message[0]!r}, expected {expect!r}")
        return message[1] if len(message) > 1 else None

    def wait_ready(self) -> None:
        for conn in self.conns:
            self._recv(conn, "ready")

    def expect(self, version: int) -> None:
        for conn in self.conns:
            conn.send(("expect", version))

    def loaded(self) -> list[float]:
        return [self._recv(conn, "loaded") for conn in self.conns]

    def fingerprints(self) -> list[dict[str, float]]:
        return [self._recv(conn, "fingerprint") for conn in self.conns]

    def roll(self, running: bool) -> None:
        """Resume (or pause) the readers' rollouts; returns once every reader did."""
        for conn in self.conns:
            conn.send(("roll", running))
        for conn in self.conns:
            self._recv(conn, "rolling")

    def stats(self) -> list[dict[str, Any]]:
        for conn in self.conns:
            conn.send(("stats", None))
        return [self._recv(conn, "stats") for conn in self.conns]

    def close(self) -> None:
        for conn in self.conns:
            try:
                conn.send(("exit", None))
                self._recv(conn, "closed", timeout=30)
            except (OSError, EOFError, TimeoutError, RuntimeError):
                pass
        for proc in self.procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join()


class Method:
    """start(readers); per size: setup(spec, state), measure(...) repeatedly, stats(), teardown(); stop()."""

    name = ""
    scenario = ""
    kind = ""  # reader process kind, "" for none
    checks_fingerprint = True
    #: Whether the readers run rollouts while they load (``--no-rollouts``: the transport alone).
    rollouts = True

    def start(self, readers: int) -> None:
        self.count = readers
        self.readers = ProcessReaders(self.kind, readers) if self.kind else None

    def setup(self, spec: Spec, state_dict: StateDict) -> None:
        raise NotImplementedError

    def measure(self, version: int, state_dict: StateDict) -> Result:
        raise NotImplementedError

    def stats(self) -> dict[str, Any]:
        return {}

    def on_node(self, present: bool) -> None:
        """Measured in turns with another method: only the one measured has its readers rolling out."""
        if self.readers is not None:
            self.readers.roll(present and self.rollouts)

    def teardown(self) -> None:
        if self.readers is not None:
            self.readers.teardown()

    def stop(self) -> None:
        if self.readers is not None:
            self.readers.close()


class Rlkube(Method):
    """rlkube as built: a WeightPublisher on the trainer, EvalWeightPlanes in the readers.

    As the trainer does it, the state dict's tensors are kept resident in the back slot after
    the first version (``keep_resident``): a send only flips; the copy into the next slot runs
    after the flip, and ``measure`` waits for it (as the next train step would) before the
    next ``advance_``. ``zero_copy=False`` (``rlkube-copy``) packs every version, as before.
    """

    kind = "rlkube"

    def __init__(
        self,
        scenario: str,
        strategy: str = "Shared",
        streams: int = 1,
        *,
        zero_copy: bool = True,
        transport: str = "tcp",
    ) -> None:
        self.scenario = scenario
        self.strategy = strategy
        self.streams = streams
        self.zero_copy = zero_copy
        self.transport = transport  # spec.policy.weightBuffer.transport: tcp (the default) or grpc
        self.name = "rlkube" if strategy == "Shared" else f"rlkube-{strategy.lower()}x{streams}"
        if not zero_copy:
            self.name += "-copy"
        if transport != "tcp":
            self.name += f"-{transport}"

    def setup(self, spec: Spec, state_dict: StateDict) -> None:
        self.root = SHM_ROOT / f"rlkube-bench-{os.getpid()}"
        remote = self.scenario == "b"
        self.publisher = WeightPublisher(
            PublisherConfig(
                shm_dir=self.root / ("train" if remote else "node"),
                listen="127.0.0.1:0" if remote else None,
                data_listen="127.0.0.1:0" if remote and self.transport == "tcp" else None,
                slot_wait_timeout=300.0,
            )
        ).connect()
        source = (
            self.publisher.address or "127.0.0.1:1"
        )  # (a): nobody fetches, the trainer writes the node's buffer
        node = str(self.root / "node")
        assert self.readers is not None
        self.readers.setup(
            [
                {
                    "spec": spec,
                    "strategy": self.strategy,
                    "shm_dir": node,
                    "source": source,
                    "streams": self.streams,
                    "rank": rank,
                    "rollouts": self.rollouts,
                }
                for rank in range(self.count)
            ]
        )
        self.readers.wait_ready()

    def measure(self, version: int, state_dict: StateDict) -> Result:
        assert self.readers is not None
        served = self.publisher.board.stats.bytes
        self.readers.expect(version)
        t0 = time.perf_counter()
        self.publisher.send(state_dict, version=version)
        sent = time.perf_counter()
        copied = self.publisher.last_copied_before_flip
        loaded = self.readers.loaded()
        self.publisher.wait_writable()  # the next train step would wait for this
        writable = time.perf_counter()
        if self.zero_copy and not self.publisher.resident:
            self.publisher.keep_resident(state_dict)  # after the first version, as the trainer does
            self.publisher.wait_writable()
        return Result(
            max(loaded) - t0,
            self.readers.fingerprints(),
            net_bytes=self.publisher.board.stats.bytes - served,
            extra={
                "send_s": sent - t0,
                "first_reader_s": min(loaded) - t0,
                "writable_s": writable - t0,
                "copied_before_flip": copied,
            },
        )

    def stats(self) -> dict[str, Any]:
        assert self.readers is not None
        stats = self.readers.stats()
        return {
            "blocked": [b for s in stats for b in s["blocked"]],
            "fetch_seconds": [f for s in stats for f in s["fetch_seconds"]],
            "elected": sum(s["elected"] for s in stats),
        }

    def teardown(self) -> None:
        super().teardown()
        self.publisher.close()
        shutil.rmtree(self.root, ignore_errors=True)


class Ray(Method):
    """Ray's object store: ``ray.put`` once, each reader actor ``ray.get`` + load (RLightning's way)."""

    def __init__(self, scenario: str, variant: str) -> None:
        self.scenario = scenario
        self.variant = variant  # numpy | torch | numpy-views
        self.name = f"ray-{variant}"
        self.load = {"numpy": "load_numpy", "numpy-views": "load_numpy_views", "torch": "load_torch"}[variant]

    def start(self, readers: int) -> None:
        import ray

        super().start(readers)
        self.ray = ray
        actor = ray.remote(num_cpus=0)(RayReader)
        self.actors = [actor.remote() for _ in range(readers)]

    def setup(self, spec: Spec, state_dict: StateDict) -> None:
        self.ray.get([a.setup.remote(spec) for a in self.actors])

    def measure(self, version: int, state_dict: StateDict) -> Result:
        ray = self.ray
        t0 = time.perf_counter()
        if self.variant.startswith("numpy"):  # bf16 has no numpy dtype: its bytes travel as int16
            payload: Any = {
                m: {
                    k: (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy() for k, t in p.items()
                }
                for m, p in state_dict.items()
            }
        else:
            payload = state_dict
        ref = ray.put(payload)
        loaded = ray.get([getattr(a, self.load).remote(ref) for a in self.actors])
        seconds = max(loaded) - t0
        del ref, payload
        return Result(seconds, ray.get([a.fingerprint.remote() for a in self.actors]))

    def teardown(self) -> None:
        self.ray.get([a.setup.remote({}) for a in self.actors])

    def stop(self) -> None:
        for actor in self.actors:
            self.ray.kill(actor)
        self.actors = []


class Gloo(Method):
    """torch.distributed gloo broadcast from the trainer to every reader (RLightning's Double, on CPU)."""

    kind = "gloo"

    def __init__(self, scenario: str, variant: str) -> None:
        self.scenario = scenario
        self.variant = variant  # per-tensor | flat
        self.name = f"gloo-{variant}"

    def start(self, readers: int) -> None:
        import torch.distributed as dist

        super().start(readers)
        self.dist = dist
        self.init = f"tcp://127.0.0.1:{free_port()}"
        self.initialized = False

    def setup(self, spec: Spec, state_dict: StateDict) -> None:
        assert self.readers is not None
        variant = "flat" if self.variant == "flat" else "per_tensor"
        self.readers.setup(
            [
                {
                    "spec": spec,
                    "init_method": self.init,
                    "rank": r + 1,
                    "world": self.count + 1,
                    "variant": variant,
                }
                for r in range(self.count)
            ]
        )
        if not self.initialized:
            self.dist.init_process_group(
                "gloo",
                init_method=self.init,
                rank=0,
                world_size=self.count + 1,
                timeout=datetime.timedelta(seconds=300),
            )
            self.initialized = True
        self.readers.wait_ready()
        self.tensors = [t for params in state_dict.values() for t in params.values()]
        self.flat = torch.empty(sum(t.numel() * t.element_size() for t in self.tensors), dtype=torch.uint8)

    def measure(self, version: int, state_dict: StateDict) -> Result:
        assert self.readers is not None
        dist = self.dist
        self.readers.expect(version)
        dist.barrier()
        t0 = time.perf_counter()
        if self.variant == "flat":
            offset = 0
            for t in self.tensors:  # pack: the trainer's one copy
                n = t.numel() * t.element_size()
                self.flat[offset : offset + n].copy_(t.reshape(-1).view(torch.uint8))
                offset += n
            dist.broadcast(self.flat, src=0)
        else:
            for t in self.tensors:
                dist.broadcast(
                    t.view(torch.float16) if t.dtype == torch.bfloat16 else t, src=0
                )  # gloo has no bf16
        loaded = self.readers.loaded()
        return Result(max(loaded) - t0, self.readers.fingerprints(), net_bytes=self.flat.numel() * self.count)

    def teardown(self) -> None:
        super().teardown()
        self.flat = torch.empty(0, dtype=torch.uint8)

    def stop(self) -> None:
        super().stop()
        if self.initialized:
            self.dist.destroy_process_group()


class RawGrpc(Method):
    """A bare gRPC server stream of the flat bytes to the node: one reader receives and discards them.

    ``lands=True`` (``grpc-raw-copy``): it copies each message into one preallocated buffer, the
    one copy any receiver that keeps the bytes makes. The node has as many rolling eval policies
    as rlkube's run beside it (see ``RawGrpcReader``).
    """

    kind = "grpc-raw"
    checks_fingerprint = False

    def __init__(self, scenario: str, *, lands: bool = False) -> None:
        self.scenario = scenario
        self.lands = lands
        self.name = "grpc-raw-copy" if lands else "grpc-raw"

    def setup(self, spec: Spec, state_dict: StateDict) -> None:
        assert self.readers is not None
        layout = layout_of(state_dict)
        self.flat = torch.empty(layout.total_bytes, dtype=torch.uint8)
        pack_into_(self.flat, state_dict, layout)
        self.server, port = serve_raw_stream(memoryview(self.flat.numpy().data))
        self.readers.setup(
            [
                {"address": f"127.0.0.1:{port}", "spec": spec, "receives": rank == 0}
                | {"rollouts": self.rollouts, "lands": self.lands, "total_bytes": self.flat.numel()}
                for rank in range(self.count)
            ]
        )
        self.readers.wait_ready()

    def measure(self, version: int, state_dict: StateDict) -> Result:
        assert self.readers is not None
        t0 = time.perf_counter()
        self.readers.expect(version)
        loaded = self.readers.loaded()
        self.readers.fingerprints()
        return Result(max(loaded) - t0, [], net_bytes=self.flat.numel())  # one stream to the node

    def teardown(self) -> None:
        super().teardown()
        self.server.stop(0).wait()


class MemcpyOnce(Method):
    """One copy of the model's flat bytes into warm memory: the cost a publish by copy cannot beat."""

    checks_fingerprint = False

    def __init__(self, scenario: str) -> None:
        self.scenario = scenario
        self.name = "memcpy-once"

    def setup(self, spec: Spec, state_dict: StateDict) -> None:
        total = sum(t.numel() * t.element_size() for p in state_dict.values() for t in p.values())
        self.src, self.dst = (np.ones(total, dtype=np.uint8) for _ in range(2))

    def measure(self, version: int, state_dict: StateDict) -> Result:
        t0 = time.perf_counter()
        np.copyto(self.dst, self.src)
        return Result(time.perf_counter() - t0)

    def teardown(self) -> None:
        del self.src, self.dst


class Memcpy(Method):
    """The copy bound: one copy of the flat bytes in, one copy out per reader (one process, warm memory)."""

    checks_fingerprint = False

    def __init__(self, scenario: str) -> None:
        self.scenario = scenario
        self.name = "memcpy-bound"

    def setup(self, spec: Spec, state_dict: StateDict) -> None:
        total = sum(t.numel() * t.element_size() for p in state_dict.values() for t in p.values())
        self.src, self.mid, self.dst = (np.ones(total, dtype=np.uint8) for _ in range(3))

    def measure(self, version: int, state_dict: StateDict) -> Result:
        t0 = time.perf_counter()
        np.copyto(self.mid, self.src)
        for _ in range(self.count):
            np.copyto(self.dst, self.mid)
        return Result(time.perf_counter() - t0)

    def teardown(self) -> None:
        del self.src, self.mid, self.dst


def methods_for(scenario: str, names: list[str]) -> list[Method]:
    """The methods of a scenario, in table order, restricted to ``names``."""
    if scenario == "a":
        every: list[Method] = [
            Rlkube("a"),
            Rlkube("a", zero_copy=False),
            Ray("a", "numpy"),
            Ray("a", "torch"),
            Ray("a", "numpy-views"),
            Gloo("a", "per-tensor"),
            Gloo("a", "flat"),
            MemcpyOnce("a"),
            Memcpy("a"),
        ]
    else:
        every = [
            Rlkube("b"),
            Rlkube("b", transport="grpc"),
            Rlkube("b", "Sharded", 4),
            RawGrpc("b"),
            RawGrpc("b", lands=True),
            Gloo("b", "flat"),
            Memcpy("b"),
        ]
    return [m for m in every if m.name in names or m.name.split("-")[0] in names]
