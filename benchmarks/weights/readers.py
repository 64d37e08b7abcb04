"""Reader processes of the weights benchmark, one per eval policy.

:func:`reader_process` runs in a spawned process and answers commands on a pipe:
``("setup", config)`` -> ``("ready",)``; ``("expect", version)`` -> ``("loaded", t)`` as soon as
the version is in the model (``t`` is ``time.perf_counter()``: CLOCK_MONOTONIC, comparable
across processes), then ``("fingerprint", {...})``; ``("roll", bool)`` pauses or resumes the
reader's rollouts; ``("stats",)``; ``("exit",)``.
:class:`RayReader` is the same reader as a Ray actor.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import mmap
import os
import threading
import time
import warnings
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rlkube.envs.types import EnvRet
from rlkube.spec import PolicySpec
from rlkube.weights.plane import EvalPlaneConfig, EvalWeightPlane

from benchmarks.weights.models import BenchPolicy, Spec, build_module, fingerprint
from benchmarks.weights.raw_stream import RawStreamReceiver

warnings.filterwarnings("ignore", message=".*not writable.*")


def bench_policy(spec: Spec, strategy: str) -> BenchPolicy:
    config = PolicySpec.model_validate(
        {"type": "Bench", "modelCfg": {"spec": spec}, "weightBuffer": {"strategy": strategy}}
    )
    return BenchPolicy(config, "eval")


class Rollouts:
    """An eval policy's rollouts, running throughout: 1 ms inference under the gate, 1 ms env step outside.

    Every reader whose figure is compared with rlkube's runs them, so that the node's CPU is
    shared alike (on a 2-core machine, 4 rolling policies take a good part of it).
    """

    def __init__(self, policy: BenchPolicy, *, running: bool = True) -> None:
        self.policy = policy
        self.stop = threading.Event()
        self.running = threading.Event()
        self.set_running(running)
        self.thread = threading.Thread(target=self.roll, name="rollouts", daemon=True)
        self.thread.start()

    def roll(self) -> None:
        obs = EnvRet(env_id=torch.arange(4), observation=torch.zeros(4, 1))
        while not self.stop.is_set():
            if not self.running.wait(0.1):
                continue
            self.policy._rollout(obs)
            time.sleep(0.001)

    def set_running(self, running: bool) -> None:
        """Pause or resume (a method measured in turns with another rests while the other is measured)."""
        if running:
            self.running.set()
        else:
            self.running.clear()

    def close(self) -> None:
        self.stop.set()
        self.thread.join()


class RlkubeReader:
    """An eval policy with BasePolicy's updater thread behind an EvalWeightPlane, rolling out meanwhile."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.policy = bench_policy(config["spec"], config["strategy"])
        self.plane = EvalWeightPlane(
            EvalPlaneConfig(
                config["strategy"],
                Path(config["shm_dir"]),
                config["source"],
                f"reader-{config['rank']}",
                streams=config.get("streams", 4),
                slot_wait_timeout=120.0,
            )
        )
        self.loaded: dict[int, float] = {}
        self.changed = threading.Condition()
        self.plane.attach(self.policy)
        self.policy.init_eval()
        commit = self.policy.commit_staged_weights

        def timed_commit(staged: Any) -> None:
            commit(staged)
            with self.changed:
                self.loaded[staged.version] = time.perf_counter()
                self.changed.notify_all()

        self.policy.commit_staged_weights = timed_commit  # type: ignore[method-assign]
        self.plane.start(self.policy)
        self.rollouts = Rollouts(self.policy, running=config["rollouts"])

    def expect(self, version: int, timeout: float = 300.0) -> float:
        with self.changed:
            if not self.changed.wait_for(lambda: version in self.loaded, timeout):
                raise TimeoutError(f"version {version} not loaded after {timeout}s")
            return self.loaded[version]

    def fingerprint(self) -> dict[str, float]:
        return self.policy.get_param_fingerprint()

    def stats(self) -> dict[str, Any]:
        receiver = self.plane.receiver
        return {
            "blocked": list(self.policy.update_block_seconds),
            "elected": bool(receiver and receiver.elected),
            "fetch_bytes": receiver.stats.bytes if receiver else 0,
            "fetch_seconds": list(receiver.stats.fetch_seconds) if receiver else [],
        }

    def close(self) -> None:
        self.rollouts.close()
        self.policy.close()
        self.plane.close()


class GlooReader:
    """A gloo rank receiving broadcasts into its model (per tensor, or one flat buffer)."""

    def __init__(self, config: dict[str, Any]) -> None:
        import torch.distributed as dist

        self.dist = dist
        if not dist.is_initialized():
            dist.init_process_group(
                "gloo",
                init_method=config["init_method"],
                rank=config["rank"],
                world_size=config["world"],
                timeout=datetime.timedelta(seconds=300),
            )
        self.flat_mode = config["variant"] == "flat"
        self.modules = {m: build_module(params) for m, params in config["spec"].items()}
        self.params = [
            self.modules[m].get_parameter(n) for m, params in config["spec"].items() for n in params
        ]
        if self.flat_mode:  # parameters are views of the receive buffer: no copy after the broadcast
            total = sum(p.numel() * p.element_size() for p in self.params)
            self.flat = torch.empty(total, dtype=torch.uint8)
            offset = 0
            for p in self.params:
                n = p.numel() * p.element_size()
                p.data = self.flat[offset : offset + n].view(p.dtype).view(p.shape)
                offset += n

    def expect(self, version: int) -> float:
        self.dist.barrier()
        if self.flat_mode:
            self.dist.broadcast(self.flat, src=0)
        else:
            for p in self.params:
                self.dist.broadcast(
                    p.data.view(torch.float16) if p.dtype == torch.bfloat16 else p.data, src=0
                )
        return time.perf_counter()

    def fingerprint(self) -> dict[str, float]:
        return fingerprint({m: dict(mod.named_parameters()) for m, mod in self.modules.items()})

    def stats(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        self.modules.clear()
        self.params.clear()
        self.flat = None


class RawGrpcReader:
    """An eval policy rolling out on a node that gets the flat bytes by one raw gRPC stream (the ceiling).

    As with rlkube, one stream reaches the node: the reader with ``receives`` streams the bytes
    and discards them, the others only roll out, so the node carries the same rollouts as
    rlkube's readers do.
    """

    def __init__(self, config: dict[str, Any]) -> None:
        self.stream = RawStreamReceiver(config["address"])
        self.receives = bool(config["receives"])
        self.landing = (
            np.empty(config["total_bytes"], dtype=np.uint8) if self.receives and config["lands"] else None
        )
        if self.landing is not None:
            self.landing[:: mmap.PAGESIZE] = 0  # warm, as rlkube's slots are prefaulted
        self.policy = bench_policy(config["spec"], "None")
        self.policy.init_eval()
        self.rollouts = Rollouts(self.policy, running=config["rollouts"])
        self.durations: list[float] = []

    def expect(self, version: int) -> float:
        started = time.perf_counter()
        if not self.receives:
            return started
        self.stream.receive(self.landing)
        end = time.perf_counter()
        self.durations.append(end - started)
        return end

    def fingerprint(self) -> dict[str, float]:
        return {}

    def stats(self) -> dict[str, Any]:
        return {"durations": self.durations}

    def close(self) -> None:
        self.rollouts.close()
        self.policy.close()
        self.stream.close()


READERS = {"rlkube": RlkubeReader, "gloo": GlooReader, "grpc-raw": RawGrpcReader}


def _exit_with_parent() -> None:
    parent = os.getppid()
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(1)  # the benchmark died: do not linger


def reader_process(conn: Connection, kind: str) -> None:
    torch.set_num_threads(1)  # readers share the cores with each other and the trainer
    threading.Thread(target=_exit_with_parent, daemon=True).start()
    reader = None
    try:
        while True:
            command, arg = conn.recv()
            if command == "setup":
                reader = READERS[kind](arg)
                conn.send(("ready",))
            elif command == "expect":
                assert reader is not None
                conn.send(("loaded", reader.expect(arg)))
                conn.send(("fingerprint", reader.fingerprint()))
            elif command == "roll":
                rollouts = getattr(reader, "rollouts", None)
                if rollouts is not None:
                    rollouts.set_running(bool(arg))
                conn.send(("rolling", bool(arg) and rollouts is not None))
            elif command == "stats":
                conn.send(("stats", reader.stats() if reader else {}))
            elif command == "teardown":
                if reader is not None:
                    reader.close()
                reader = None
                gc.collect()
                conn.send(("down",))
            elif command == "exit":
                if reader is not None:
                    reader.close()
                if kind == "gloo":
                    import torch.distributed as dist

                    if dist.is_initialized():
                        dist.destroy_process_group()
                conn.send(("closed",))
                return
    except (EOFError, KeyboardInterrupt):
        return
    except BaseException as exc:
        with contextlib.suppress(Exception):
            conn.send(("error", f"{type(exc).__name__}: {exc}"))
        raise
    finally:
        reader = None
        gc.collect()


class RayReader:
    """A Ray actor holding an eval model; loads what ``ray.get`` hands it, as RLightning's eval workers do."""

    def __init__(self) -> None:
        torch.set_num_threads(1)
        self.modules: dict[str, torch.nn.Module] = {}
        self.held: Any = None

    def setup(self, spec: Spec) -> None:
        self.modules, self.held = {}, None
        gc.collect()
        self.modules = {m: build_module(params) for m, params in spec.items()}

    def _targets(self) -> dict[str, dict[str, torch.Tensor]]:
        return {m: dict(mod.named_parameters()) for m, mod in self.modules.items()}

    def load_numpy(self, state: dict[str, dict[str, np.ndarray]]) -> float:
        """ray.get gave zero-copy numpy views of the object store; load copies them into the model."""
        for module, params in self._targets().items():
            for name, param in params.items():
                src = torch.from_numpy(state[module][name])
                param.data.copy_(src.view(param.dtype) if param.dtype == torch.bfloat16 else src)
        return time.perf_counter()

    def load_numpy_views(self, state: dict[str, dict[str, np.ndarray]]) -> float:
        """Not RLightning's path: parameters become views of the (immutable) object store buffers."""
        for module, params in self._targets().items():
            for name, param in params.items():
                src = torch.from_numpy(state[module][name])
                param.data = src.view(param.dtype) if param.dtype == torch.bfloat16 else src
        self.held = state
        return time.perf_counter()

    def load_torch(self, state: dict[str, dict[str, torch.Tensor]]) -> float:
        for module, params in self._targets().items():
            for name, param in params.items():
                param.data.copy_(state[module][name])
        return time.perf_counter()

    def fingerprint(self) -> dict[str, float]:
        return fingerprint(self._targets())
