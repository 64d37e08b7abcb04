"""Where a process's time goes, by stage of the trajectory plane, from a py-spy profile.

``py-spy record --pid PID --format raw --threads --idle -o wall.txt`` (every thread, waiting
included) or ``--gil`` (only the thread holding the GIL) attached to train rank 0, an eval
worker or a ``rlkube bench intake`` process; then ``python -m benchmarks.rollout.stages
wall.txt [--threads]``. Each sample is given the stage of the innermost frame that names one
(:data:`STAGES`); ``--threads`` splits the main thread from the others (gRPC handlers, senders).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter, defaultdict

#: (text in a frame, stage), tried on each frame from the innermost outwards.
STAGES: tuple[tuple[str, str], ...] = (
    ("TaskStream._send", "worker: push on a sender thread"),
    ("TaskStream.next_task", "worker: next task (LeaseTask when no push brought one)"),
    ("TaskStream.push", "worker: hand-off to a sender (waiting for a credit)"),
    ("EvalWorker._load", "worker: weights wait / load"),
    ("EvalWorker._report", "worker: weights report"),
    ("RolloutWorker.collect", "worker: rollout (env + policy)"),
    ("PolicyGroupClient.lease", "worker: LeaseTask round trip"),
    ("PolicyGroupClient.push", "worker: PushFragment round trip"),
    ("_WithToken.__call__", "worker: waiting for rank 0's answer"),
    ("PushStream.push", "worker: waiting for rank 0's answer"),
    ("fragment_to_proto", "encode (TensorDict -> message)"),
    ("sync_through", "journal: sync (shared by the pushes waiting)"),
    ("Segment.append", "journal: append the entry"),
    ("_write_synced", "journal: a synced file (count record, quarantine)"),
    ("journal.py", "journal: other"),
    ("_hold_gil", "training (the bench's learner)"),
    ("train_step", "training"),
    ("train_on", "training"),
    ("fragment_from_proto", "decode (message -> TensorDict)"),
    ("trajectory_problem", "edge checks (spaces, finiteness, schema)"),
    ("RolloutBuffer.add", "buffer insert"),
    ("Coordinator.push (", "push: bookkeeping + coordinator lock"),
    ("Coordinator.stage_push (", "push: checks, board + coordinator lock"),
    ("Coordinator.complete_push (", "push: acknowledge (buffer, progress)"),
    ("GroupSync", "journal: sync scheduling on the loop"),
    ("Coordinator.lease (", "lease: coordinator lock + long poll"),
    ("wait_batch", "engine: waiting for a step's fragments"),
    ("take_epoch", "engine: take the step"),
    ("concat_rows", "engine: stack"),
    ("PolicyGroupServicer", "servicer"),
    ("EvalWorker._serve", "worker loop"),
    ("grpc/_server.py", "gRPC server machinery"),
    ("grpc/aio/", "gRPC server machinery (asyncio)"),
    ("asyncio/", "event loop"),
    ("_reap", "reaper (idle)"),
    ("concurrent/futures/thread.py", "idle handler threads"),
)


def stage_of(frames: list[str]) -> str:
    for frame in reversed(frames):
        for needle, name in STAGES:
            if needle in frame:
                return name
    return "other"


def breakdown(lines: list[str], *, threads: bool) -> dict[str, Counter[str]]:
    """Samples per stage, per thread group (``main`` / ``others``, or ``all``)."""
    found: dict[str, Counter[str]] = defaultdict(Counter)
    for line in lines:
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if not stack:
            continue
        frames = stack.split(";")
        group = "all"
        if threads and frames[0].startswith("thread"):
            group = "main" if "MainThread" in frames[0] else "others"
            frames = frames[1:]
        found[group][stage_of(frames)] += int(count)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("profile", help="py-spy record --format raw output")
    parser.add_argument("--threads", action="store_true", help="the profile has --threads: split them")
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args(argv)
    with open(args.profile) as handle:
        found = breakdown(handle.readlines(), threads=args.threads)
    for group, counter in found.items():
        total = sum(counter.values())
        print(f"{group}: {total} samples")
        for name, count in counter.most_common(args.top):
            print(f"  {100 * count / total:5.1f}%  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
