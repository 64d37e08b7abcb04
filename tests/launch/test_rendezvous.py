"""Train ranks rendezvous with the rank 0 running now, never with one that formed its group earlier."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import IO

import pytest
from rlkube.engine.trainer import Stopped
from rlkube.launch.processes import free_port
from rlkube.launch.rendezvous import RendezvousTimeout, join_process_group

RANK = textwrap.dedent(
    """
    import logging, os, sys, threading
    from datetime import timedelta
    import torch, torch.distributed as dist
    from rlkube.launch.rendezvous import join_process_group

    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    rank, port = int(sys.argv[1]), int(sys.argv[2])
    name = join_process_group(
        backend="gloo", master_addr="127.0.0.1", master_port=port, rank=rank, world_size=2,
        timeout=timedelta(seconds=120), stop=threading.Event(),
    )
    total = torch.tensor([rank + 1])
    dist.all_reduce(total)
    print("formed", name, int(total), flush=True)
    sys.stdin.readline()  # until told to go (or its stdin closes)
    os._exit(0)
    """
)


class Rank:
    """One train rank as a process; its stdout and stderr lines read as they come."""

    def __init__(self, rank: int, port: int) -> None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p), OMP_NUM_THREADS="1")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", RANK, str(rank), str(port)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.out: queue.Queue[str] = queue.Queue()
        self.err: queue.Queue[str] = queue.Queue()
        for stream, lines in ((self.proc.stdout, self.out), (self.proc.stderr, self.err)):
            threading.Thread(target=self._read, args=(stream, lines), daemon=True).start()

    @staticmethod
    def _read(stream: IO[str], lines: queue.Queue[str]) -> None:
        for line in stream:
            lines.put(line.rstrip("\n"))

    def formed(self, timeout: float = 120) -> tuple[str, int]:
        """The rendezvous this rank formed its group in, and its all-reduced sum (3 for ranks 0, 1)."""
        line = self.out.get(timeout=timeout)
        word, name, total = line.split()
        assert word == "formed", line
        return name, int(total)

    def logged(self, text: str, timeout: float = 120) -> str:
        while True:
            line = self.err.get(timeout=timeout)
            if text in line:
                return line

    def release(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        self.proc.wait(timeout=30)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()


@pytest.fixture
def ranks() -> Iterator[list[Rank]]:
    started: list[Rank] = []
    yield started
    for rank in started:
        rank.kill()


def test_a_restarted_rank_waits_out_the_rank_0_it_lost_and_joins_its_successor(ranks: list[Rank]) -> None:
    port = free_port()
    ranks += [Rank(0, port), Rank(1, port)]
    first = [rank.formed() for rank in ranks]
    assert first[0] == first[1]
    assert first[0][1] == 3

    # Rank 1 dies and restarts at once, while rank 0 still runs: its group formed, its store serves.
    ranks[1].kill()
    ranks.append(Rank(1, port))
    ranks[2].logged(f"waiting for rank 0 at 127.0.0.1:{port} to open a rendezvous")

    # That rank 0 goes (in a cluster: it fails with the peer it lost); its successor starts.
    ranks[0].release()
    ranks.append(Rank(0, port))
    second = [ranks[3].formed(), ranks[2].formed()]
    assert second[0] == second[1]
    assert second[0][1] == 3
    assert second[0][0] != first[0][0]  # a rendezvous of its own, not the old group's keys


def join_alone(rank: int, world_size: int, *, timeout: timedelta, stop: threading.Event) -> str:
    """``rank`` joining on a free port, with no other rank ever coming."""
    return join_process_group(
        backend="gloo",
        master_addr="127.0.0.1",
        master_port=free_port(),
        rank=rank,
        world_size=world_size,
        timeout=timeout,
        stop=stop,
    )


def test_a_rank_asked_to_stop_while_waiting_for_rank_0_stops() -> None:
    stop = threading.Event()
    threading.Timer(0.2, stop.set).start()
    with pytest.raises(Stopped, match=r"rank 0 at 127\.0\.0\.1"):
        join_alone(1, 2, timeout=timedelta(minutes=10), stop=stop)


def test_rank_0_names_what_it_waited_for_when_the_other_ranks_never_come() -> None:
    with pytest.raises(RendezvousTimeout, match="train ranks 1-2 to join"):
        join_alone(0, 3, timeout=timedelta(seconds=1), stop=threading.Event())
