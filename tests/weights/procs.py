"""Helper processes for the weight-plane tests: ``python -m tests.weights.procs ROLE ARGS``.

Each role prints JSON lines on stdout (``{"ready": ...}`` first) and reads commands from stdin
where it needs them.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
from rlkube.weights.copies import buffer_checksum
from rlkube.weights.layout import layout_of, pack_into_
from rlkube.weights.shm import ShmWriter
from rlkube.weights.shm_reader import ShmReader


def say(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def filled_state_dict(value: float, *, scale: int = 1) -> dict[str, dict[str, torch.Tensor]]:
    """Every element of every tensor equals ``value``: a torn or mixed snapshot shows two values."""
    return {
        "body": {
            "w": torch.full((256 * scale, 64), value),
            "b": torch.full((64,), value, dtype=torch.float64),
        },
        "head": {"n": torch.full((1000 * scale,), int(value), dtype=torch.int32)},
    }


def publish(writer: ShmWriter, version: int, *, incarnation: str = "test", scale: int = 1) -> None:
    sd = filled_state_dict(float(version), scale=scale)
    layout = layout_of(sd)
    lease = writer.begin(version=version, incarnation=incarnation, layout=layout)
    pack_into_(lease.tensor, sd, layout)
    writer.commit(lease, checksum=buffer_checksum(lease.array, 4096), chunk_bytes=4096)


def snapshot_problems(views: dict[str, dict[str, torch.Tensor]], version: int) -> list[str]:
    problems = []
    for module, params in views.items():
        for name, tensor in params.items():
            if tensor.numel() and not bool((tensor == version).all()):
                values = torch.unique(tensor.double()).tolist()[:4]
                problems.append(f"v{version} {module}.{name} holds {values}")
    return problems


def reader_loop(directory: str, last_version: str, lockstep_rounds: str = "0") -> None:
    """Acquire snapshots until ``last_version``; report torn or mixed ones.

    First ``lockstep_rounds`` rounds in step with the test: on "pin" pin the newest snapshot and
    say its version, hold it while the test commits the next version, re-check it on "check"
    and let it go. Then as fast as possible, racing the writer.
    """
    stop = int(last_version)
    reader = ShmReader(directory, verify=True).open()
    say(ready=True)
    snapshots, versions, problems = 0, set(), []
    for _ in range(int(lockstep_rounds)):
        assert json.loads(sys.stdin.readline()) == {"pin": True}
        snap = reader.acquire()
        assert snap is not None
        try:
            problems += snapshot_problems(snap.views, snap.version)
            say(pinned=snap.version)
            assert json.loads(sys.stdin.readline()) == {"check": True}  # a newer version is committed
            problems += snapshot_problems(snap.views, snap.version)
            snapshots += 1
            versions.add(snap.version)
        finally:
            snap.release()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        snap = reader.acquire()
        if snap is None:
            continue
        try:
            problems += snapshot_problems(snap.views, snap.version)
            time.sleep(0.0001)  # hold the pin a little: the writer must wait, not overwrite
            problems += snapshot_problems(snap.views, snap.version)
            snapshots += 1
            versions.add(snap.version)
            done = snap.version >= stop
        finally:
            snap.release()
        if done:
            break
    reader.close()
    say(snapshots=snapshots, versions=len(versions), problems=problems[:10])


def hanging_writer(directory: str) -> None:
    """Publish version 1, then start version 2 and stop half-way (to be SIGKILLed there)."""
    writer = ShmWriter(directory).open()
    publish(writer, 1)
    sd = filled_state_dict(2.0)
    layout = layout_of(sd)
    lease = writer.begin(version=2, incarnation="test", layout=layout)
    half = lease.tensor[: layout.total_bytes // 2]
    half.fill_(7)
    say(writing=True, slot=lease.index)
    time.sleep(600)


def pinning_reader(directory: str) -> None:
    """Pin the newest snapshot and hold it until told to release (a slow eval policy)."""
    reader = ShmReader(directory).open()
    snap = reader.acquire()
    say(ready=True, version=None if snap is None else snap.version)
    sys.stdin.readline()
    if snap is not None:
        snap.release()
    reader.close()
    say(done=True)


def eval_worker(directory: str, address: str, worker_id: str, strategy: str) -> None:
    """An eval process: a TinyPolicy behind an EvalWeightPlane; answers {"sync": v} with what it loaded."""
    from rlkube.weights.plane import EvalPlaneConfig, EvalWeightPlane

    from tests.weights.tiny import observation, tiny_policy

    policy = tiny_policy("eval", strategy=strategy, seed=7)
    plane = EvalWeightPlane(EvalPlaneConfig(strategy, Path(directory), address, worker_id))
    plane.attach(policy)
    policy.init_eval()
    plane.start(policy)
    say(ready=True)
    for line in sys.stdin:
        command = json.loads(line)
        if "sync" in command:
            key = plane.sync(policy, min_version=command["sync"], timeout=30)
            policy._rollout(observation())
            say(
                version=key[1] if key else None,
                elected=plane.receiver.elected if plane.receiver else False,
                fingerprint=policy.get_param_fingerprint(),
                pid=os.getpid(),
            )
        if command.get("exit"):
            break
    policy.close()
    plane.close()
    say(closed=True)


def checking_pinner(directory: str) -> None:
    """Pin the newest snapshot; when told, check it is still whole and unchanged, then read the newest."""
    reader = ShmReader(directory).open()
    snap = reader.acquire()
    assert snap is not None
    say(ready=True, version=snap.version)
    sys.stdin.readline()  # (the test stops this process for a while here)
    problems = snapshot_problems(snap.views, snap.version)
    held = snap.version
    snap.release()
    with reader.acquire() as newest:
        say(
            held=held,
            problems=problems,
            newest=newest.version,
            newest_problems=snapshot_problems(newest.views, newest.version),
        )
    reader.close()


def packing_publisher(directory: str) -> None:
    """A trainer that publishes version 1, then hangs packing version 2 before its last chunk once
    a fetch streams it (prints ``{"holding": true}``), until it is killed."""
    import threading

    from rlkube.weights.publisher import PublisherConfig, WeightPublisher

    config = PublisherConfig(
        shm_dir=Path(directory), listen="127.0.0.1:0", chunk_bytes=4096, pack_threads=1, incarnation="inc"
    )
    publisher = WeightPublisher(config).connect()
    publisher.send(filled_state_dict(1.0), version=1)
    say(ready=True, address=publisher.address)

    def hold(index: int, chunks: int) -> None:
        if index == chunks - 1:
            publisher.board.wait_streamed(("inc", 2), timeout=60)
            say(holding=True)
            threading.Event().wait()

    publisher.pack_gate = hold
    sys.stdin.readline()  # "send version 2"
    publisher.send(filled_state_dict(2.0), version=2)


def resident_trainer(directory: str) -> None:
    """A trainer that publishes version 1, keeps its tensors resident and trains in the other slot
    (prints ``{"training": true}``) until it is killed, without publishing again."""
    from rlkube.weights.publisher import PublisherConfig, WeightPublisher

    publisher = WeightPublisher(PublisherConfig(shm_dir=Path(directory), incarnation="inc")).connect()
    state = filled_state_dict(1.0)
    publisher.send(state, version=1)
    assert publisher.keep_resident(state)
    publisher.wait_writable()
    for params in state.values():
        for tensor in params.values():
            tensor.add_(1)  # training, in the slot that is not latest
    say(training=True)
    sys.stdin.readline()


ROLES = {
    "resident-trainer": resident_trainer,
    "packing-publisher": packing_publisher,
    "checking-pinner": checking_pinner,
    "reader-loop": reader_loop,
    "hanging-writer": hanging_writer,
    "pinning-reader": pinning_reader,
    "eval-worker": eval_worker,
}

if __name__ == "__main__":
    ROLES[sys.argv[1]](*sys.argv[2:])
