"""``rlkube bench auth``: what the per-job credential costs on the weight stream and the trajectory push.

Side by side in one process run, interleaved round by round: the same WeightStore fetch and the
same push (on the worker's PushFragments stream, where the token is checked when the stream opens
and again for each push) against a server without the token interceptor ("open") and one with it
("token"; the client attaches the token with its interceptor), and the per-call cost on the
cheapest call (Heartbeat, in blocks of 50), which on a loaded machine resolves what the
end-to-end rows cannot (run ``--aa`` to see their noise floor). Prints the median of each and
the ratio token/open; the check is once per call, so the expected cost is well under 2%.
Server and client share one process (and its GIL): absolute figures are lower than across
processes, the ratio is what counts. Each call is timed twice: wall clock, and the process's CPU
time (client, server and gRPC's threads together), which other load on a shared machine
disturbs far less; the cost column is computed from both.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rlkube._proto import policy_group_pb2 as pb
from rlkube.coordinator.client import PolicyGroupClient
from rlkube.coordinator.service import CoordinatorServer
from rlkube.coordinator.state import Coordinator
from rlkube.coordinator.wire import fragment_to_proto
from rlkube.data.fragment import Fragment
from rlkube.security.credential import TOKEN_FILE_ENV, Credential, new_token, write_token_file
from rlkube.spec import parse_job
from rlkube.weights.client import WeightStoreClient
from rlkube.weights.publisher import PublisherConfig, WeightPublisher
from tensordict import TensorDict

MODES = ("open", "token")


#: ``--aa``: both setups without the credential, to show the noise floor of the comparison.
AA = {"on": False}


def _credential(mode: str, token: str) -> Credential:
    return Credential.of_token(token) if mode == "token" and not AA["on"] else Credential.open()


def weight_stream(*, mib: int, rounds: int, token: str, token_file: Path) -> dict[str, list[float]]:
    """Seconds per full fetch of a ``mib`` MiB version, per mode."""
    state = {"model": {"w": torch.rand(mib * (1 << 18))}}  # float32: mib MiB
    publishers: dict[str, WeightPublisher] = {}
    clients: dict[str, WeightStoreClient] = {}
    with tempfile.TemporaryDirectory(dir="/dev/shm") as shm:
        try:
            for mode in MODES:
                os.environ.pop(TOKEN_FILE_ENV, None)
                if mode == "token" and not AA["on"]:
                    os.environ[TOKEN_FILE_ENV] = str(token_file)  # the publisher's server reads it
                config = PublisherConfig(shm_dir=Path(shm) / mode, listen="127.0.0.1:0")
                publishers[mode] = publisher = WeightPublisher(config).connect()
                publisher.send(state, version=1)
                clients[mode] = WeightStoreClient(
                    publisher.address or "", credential=_credential(mode, token)
                ).connect()
            os.environ.pop(TOKEN_FILE_ENV, None)
            latest = {mode: publishers[mode].board.latest() for mode in MODES}
            dst = np.empty(latest["open"].total_bytes, dtype=np.uint8)  # type: ignore[union-attr]
            times: dict[str, list[float]] = {m: [] for mode in MODES for m in (mode, f"{mode}-cpu")}
            for i in range(rounds + 1):  # the first round warms up and is dropped
                for mode in MODES if i % 2 else MODES[::-1]:  # alternate who goes first
                    wall, cpu = time.perf_counter(), time.process_time()
                    clients[mode].fetch_into(latest[mode], dst)  # type: ignore[arg-type]
                    times[mode].append(time.perf_counter() - wall)
                    times[f"{mode}-cpu"].append(time.process_time() - cpu)
            return {mode: values[1:] for mode, values in times.items()}
        finally:
            for client in clients.values():
                client.close()
            for publisher in publishers.values():
                publisher.close()


def _job(fragments: int, num_envs: int, steps: int) -> Any:
    return parse_job(
        {
            "metadata": {"name": "bench"},
            "spec": {
                "env": {"id": "CartPole-v1", "numEnvs": num_envs},
                "train": {
                    "stepsPerEpoch": fragments * num_envs * steps,
                    "batchSize": num_envs * steps,
                    "fragmentLength": steps,
                },
                "buffer": {"capacity": fragments},
            },
        }
    )


def cartpole_trajectories(num_envs: int, steps: int, obs: int) -> TensorDict:
    """A well-formed CartPole-shaped fragment's data (random observations); also the hostile-client tests'."""
    n, t = num_envs, steps
    return TensorDict(
        {
            "observation": torch.rand(n, t, obs),
            "action": torch.zeros(n, t, dtype=torch.int64),
            "log_prob": torch.zeros(n, t),
            "reward": torch.ones(n, t),
            "terminated": torch.zeros(n, t, dtype=torch.bool),
            "truncated": torch.zeros(n, t, dtype=torch.bool),
            "next_observation": torch.rand(n, t, obs),
        },
        batch_size=[n, t],
    )


def trajectory_push(
    *, pushes: int, num_envs: int, steps: int, obs: int, token: str
) -> dict[str, list[float]]:
    """Seconds per accepted PushFragment (lease excluded), per mode."""
    data = cartpole_trajectories(num_envs, steps, obs)
    setups = {}
    for mode in MODES:
        coordinator = Coordinator(_job(pushes + 1, num_envs, steps))
        server = CoordinatorServer(
            coordinator, address="127.0.0.1:0", credential=_credential(mode, token)
        ).start()
        client = PolicyGroupClient(f"127.0.0.1:{server.port}", credential=_credential(mode, token))
        request = pb.RegisterRequest(role="eval", pod_name=f"bench-{mode}", num_envs=num_envs)
        worker_id = client.register(request, retry_for=5.0).worker_id
        coordinator.open_epoch(epoch=1, version=0)
        setups[mode] = (coordinator, server, client, worker_id)
    times: dict[str, list[float]] = {m: [] for mode in MODES for m in (mode, f"{mode}-cpu")}
    try:
        for i in range(pushes + 1):
            for mode in MODES if i % 2 else MODES[::-1]:  # alternate who goes first
                _, _, client, worker_id = setups[mode]
                task = client.lease(worker_id, wait_seconds=1.0)
                message = fragment_to_proto(
                    Fragment(data=data), task_id=task.task_id, worker_id=worker_id, epoch=1
                )
                wall, cpu = time.perf_counter(), time.process_time()
                ack = client.push(message, retry_for=0)
                elapsed, cpu_elapsed = time.perf_counter() - wall, time.process_time() - cpu
                assert ack.accepted, ack
                if i:
                    times[mode].append(elapsed)
                    times[f"{mode}-cpu"].append(cpu_elapsed)
        return times
    finally:
        for coordinator, server, client, _ in setups.values():
            client.close()
            coordinator.finish()
            server.stop(grace=0.2)


def per_call(*, calls: int, token: str, block: int = 50) -> dict[str, list[float]]:
    """Seconds per Heartbeat (the cheapest call: what the credential adds to any call), per mode."""
    setups = {}
    requests: dict[str, pb.HeartbeatRequest] = {}
    for mode in MODES:
        coordinator = Coordinator(_job(1, 1, 1))
        server = CoordinatorServer(
            coordinator, address="127.0.0.1:0", credential=_credential(mode, token)
        ).start()
        client = PolicyGroupClient(f"127.0.0.1:{server.port}", credential=_credential(mode, token))
        # A member's heartbeat (an unknown worker's is answered NOT_FOUND, an error to the client).
        member = pb.RegisterRequest(role="eval", pod_name=f"bench-{mode}", num_envs=1)
        requests[mode] = pb.HeartbeatRequest(worker_id=client.register(member, retry_for=5.0).worker_id)
        setups[mode] = (coordinator, server, client)
    times: dict[str, list[float]] = {m: [] for mode in MODES for m in (mode, f"{mode}-cpu")}
    try:
        for i in range(calls // block + 1):
            for mode in MODES if i % 2 else MODES[::-1]:
                client = setups[mode][2]
                wall, cpu = time.perf_counter(), time.process_time()
                for _ in range(block):
                    client.heartbeat(requests[mode])
                if i:  # the first block warms up
                    times[mode].append((time.perf_counter() - wall) / block)
                    times[f"{mode}-cpu"].append((time.process_time() - cpu) / block)
        return times
    finally:
        for coordinator, server, client in setups.values():
            client.close()
            coordinator.finish()
            server.stop(grace=0.2)


def summarize(name: str, unit: str, times: dict[str, list[float]], scale: float) -> dict[str, Any]:
    medians = {mode: statistics.median(values) for mode, values in times.items()}
    # CPU time: totals over every call (single calls are below the clock's resolution).
    cpu = {mode: sum(times[f"{mode}-cpu"]) for mode in MODES}
    return {
        "row": name,
        "unit": unit,
        **{mode: round(scale / medians[mode], 1) for mode in MODES},
        "cost_percent": round(100 * (medians["token"] / medians["open"] - 1), 2),
        "cpu_cost_percent": round(100 * (cpu["token"] / cpu["open"] - 1), 2),
        "samples": len(times["open"]),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rlkube bench auth", description=__doc__.split("\n\n")[0])
    parser.add_argument("--weight-mib", type=int, default=64, help="size of the version fetched")
    parser.add_argument("--rounds", type=int, default=15, help="fetches per mode")
    parser.add_argument("--pushes", type=int, default=300, help="pushes per mode")
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--obs", type=int, default=16, help="observation size (floats)")
    parser.add_argument("--calls", type=int, default=2000, help="Heartbeats per mode (per-call cost)")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    parser.add_argument("--aa", action="store_true", help="no credential on either side: the noise floor")
    args = parser.parse_args(argv)
    AA["on"] = args.aa
    token = new_token()
    with tempfile.TemporaryDirectory() as tmp:
        token_file = write_token_file(Path(tmp) / "token", token)
        fetch = weight_stream(mib=args.weight_mib, rounds=args.rounds, token=token, token_file=token_file)
    push = trajectory_push(
        pushes=args.pushes, num_envs=args.num_envs, steps=args.steps, obs=args.obs, token=token
    )
    calls = per_call(calls=args.calls, token=token, block=20)
    fragment_kib = cartpole_trajectories(args.num_envs, args.steps, args.obs).bytes() / 1024
    # Per call: the fastest block of each (least disturbed by other load on a shared machine).
    overhead = min(calls["token"]) - min(calls["open"])
    push_seconds = min(push["open"])  # the fastest, as for the per-call figure
    fetch_seconds = min(fetch["open"])
    print(
        f"per call (fastest block): open {1e6 * min(calls['open']):.0f} us, token "
        f"{1e6 * min(calls['token']):.0f} us: the credential adds {1e6 * overhead:.0f} us "
        f"= {100 * overhead / push_seconds:.2f}% of a push ({1e3 * push_seconds:.2f} ms), "
        f"{100 * overhead / fetch_seconds:.3f}% of a {args.weight_mib} MiB fetch "
        f"({1e3 * fetch_seconds:.0f} ms)"
    )
    rows = [
        {
            "row": "per call (Heartbeat)",
            "open_us": round(1e6 * min(calls["open"]), 1),
            "token_us": round(1e6 * min(calls["token"]), 1),
            "open_median_us": round(1e6 * statistics.median(calls["open"]), 1),
            "token_median_us": round(1e6 * statistics.median(calls["token"]), 1),
            "overhead_us": round(1e6 * overhead, 1),
            "of_push_percent": round(100 * overhead / push_seconds, 2),
            "of_fetch_percent": round(100 * overhead / fetch_seconds, 3),
        },
        summarize(f"weight stream, {args.weight_mib} MiB fetch", "MiB/s", fetch, args.weight_mib),
        summarize(f"trajectory push, {fragment_kib:.0f} KiB fragment", "pushes/s", push, 1.0),
    ]
    print(f"{'row':38s} {'unit':9s} {'open':>9s} {'token':>9s} {'wall cost':>10s} {'cpu cost':>9s}")
    for row in rows[1:]:
        print(
            f"{row['row']:38s} {row['unit']:9s} {row['open']:9.1f} {row['token']:9.1f} "
            f"{row['cost_percent']:9.2f}% {row['cpu_cost_percent']:8.2f}%"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0
