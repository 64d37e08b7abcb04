"""Two "nodes" in network namespaces of their own, joined through a bridge, for ``rlkube run --netns``.

Needs root (creating namespaces and links); a test that asks for them is skipped where that is
not allowed. Only link-local addresses this helper assigns are used: a bridge in this namespace
holds ``169.254.S.254/24`` (so the test and ``rlkube run`` reach node 0), node ``i`` holds
``169.254.S.(i+1)`` on its end of a veth pair. Names carry a random tag; everything is removed
afterwards, also when the test fails (processes still in a namespace are killed by pid first).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

import pytest


def _ip(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *argv], capture_output=True, text=True, check=False)


def _must(*argv: str) -> str:
    result = _ip(*argv)
    if result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(argv)}: {result.stderr.strip()}")
    return result.stdout


@dataclass(frozen=True)
class Nodes:
    namespaces: tuple[str, ...]
    addresses: tuple[str, ...]
    #: node i's veth inside its namespace (where ``tc`` shapes what leaves the node)
    interfaces: tuple[str, ...]

    @property
    def netns_arg(self) -> str:
        return ",".join(self.namespaces)

    def shape(self, node: int, *, rate: str) -> None:
        """Limit what leaves ``node`` to ``rate`` (a token bucket on its veth), e.g. ``"4mbit"``."""
        result = subprocess.run(
            ["ip", "netns", "exec", self.namespaces[node], "tc", "qdisc", "add", "dev", self.interfaces[node],
             "root", "tbf", "rate", rate, "burst", "16kb", "latency", "400ms"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if result.returncode != 0:
            raise RuntimeError(f"tc on {self.namespaces[node]}: {result.stderr.strip()}")

    def send_queue(self, node: int, *, port: int, to: int) -> int:
        """Bytes queued, not yet acknowledged, on ``node``'s TCP connections from local ``port`` to
        node ``to``."""
        result = subprocess.run(
            ["ip", "netns", "exec", self.namespaces[node], "ss", "-tnH", "state", "established",
             f"( sport = :{port} )"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        queued = 0
        for line in result.stdout.splitlines():
            fields = line.split()  # Recv-Q Send-Q Local:Port Peer:Port
            if len(fields) >= 4 and fields[1].isdigit():
                peer = fields[3].rpartition(":")[0].strip("[]").removeprefix("::ffff:")
                if peer == self.addresses[to]:
                    queued += int(fields[1])
        return queued


def _kill_everything_in(namespace: str) -> None:
    pids = _ip("netns", "pids", namespace).stdout.split()
    for pid in pids:  # the processes the test started in its own namespace
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)


@contextlib.contextmanager
def two_nodes() -> Iterator[Nodes]:
    """Two namespaced nodes bridged to this namespace; skips where namespaces cannot be made."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    if shutil.which("ip") is None or shutil.which("tc") is None or shutil.which("ss") is None:
        pytest.skip("network namespaces need iproute2 (ip, tc, ss)")
    tag = secrets.token_hex(3)
    subnet = 100 + secrets.randbelow(60)  # 169.254.100-159.x: clear of 169.254.169.254
    bridge = f"rlkbr{tag}"
    namespaces = tuple(f"rlk-{tag}-n{i}" for i in range(2))
    inside = tuple(f"rlk{tag}i{i}" for i in range(2))
    outside = tuple(f"rlk{tag}o{i}" for i in range(2))
    made: list[str] = []
    try:
        if _ip("link", "add", bridge, "type", "bridge").returncode != 0:
            pytest.skip("cannot create a bridge here (no CAP_NET_ADMIN?)")
        for i, namespace in enumerate(namespaces):
            if _ip("netns", "add", namespace).returncode != 0:
                pytest.skip("`ip netns add` is not allowed here")
            made.append(namespace)
            _must("link", "add", outside[i], "type", "veth", "peer", "name", inside[i])
            _must("link", "set", inside[i], "netns", namespace)
            _must("link", "set", outside[i], "master", bridge)
            _must("link", "set", outside[i], "up")
            _must("-n", namespace, "addr", "add", f"169.254.{subnet}.{i + 1}/24", "dev", inside[i])
            _must("-n", namespace, "link", "set", inside[i], "up")
            _must("-n", namespace, "link", "set", "lo", "up")
        _must("addr", "add", f"169.254.{subnet}.254/24", "dev", bridge)
        _must("link", "set", bridge, "up")
        yield Nodes(
            namespaces=namespaces,
            addresses=tuple(f"169.254.{subnet}.{i + 1}" for i in range(2)),
            interfaces=inside,
        )
    finally:
        for namespace in made:
            _kill_everything_in(namespace)
            _ip("netns", "del", namespace)  # takes its veth end, and so the pair, with it
        for name in outside:
            _ip("link", "del", name)  # in case its namespace never got it
        _ip("link", "del", bridge)
