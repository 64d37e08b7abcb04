"""Two "nodes" in network namespaces of their own, joined through a bridge, for ``rlkube run --netns``.

Needs root (creating namespaces and links); a test that asks for them is skipped where that is
not allowed. Only link-local addresses this helper assigns are used: a bridge in this namespace
holds ``169.254.S.254/24`` (so the test and ``rlkube run`` reach node 0), node ``i`` holds
``169.254.S.(i+1)`` on its end of a veth pair. Names carry a random tag; everything is removed
afterwards, also when the test fails (processes still in a namespace are killed by pid first):
:func:`rlkube.launch.netns.link_local_nodes` makes and removes them.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from rlkube.launch.netns import LinkLocalNodes, NetnsUnavailable, link_local_nodes


@dataclass(frozen=True)
class Nodes:
    namespaces: tuple[str, ...]
    addresses: tuple[str, ...]
    #: node i's veth inside its namespace (where ``tc`` shapes what leaves the node)
    interfaces: tuple[str, ...]
    made: LinkLocalNodes

    @property
    def netns_arg(self) -> str:
        return ",".join(self.namespaces)

    def shape(self, node: int, *, rate: str) -> None:
        """Limit what leaves ``node`` to ``rate`` (a token bucket on its veth), e.g. ``"4mbit"``."""
        self.made.shape(node, rate=rate)

    def send_queue(self, node: int, *, to: int, port: int | None = None) -> int:
        """Bytes queued, not yet acknowledged, on ``node``'s TCP connections (from local ``port``,
        if given) to node ``to``."""
        only = [f"( sport = :{port} )"] if port is not None else []
        result = subprocess.run(
            ["ip", "netns", "exec", self.namespaces[node], "ss", "-tnH", "state", "established", *only],
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


@contextlib.contextmanager
def two_nodes() -> Iterator[Nodes]:
    """Two namespaced nodes bridged to this namespace; skips where namespaces cannot be made."""
    if shutil.which("ss") is None:
        pytest.skip("network namespaces need iproute2 (ip, tc, ss)")
    try:
        with link_local_nodes(2) as made:
            yield Nodes(
                namespaces=made.namespaces,
                addresses=tuple(node.address for node in made.nodes),
                interfaces=tuple(node.interface for node in made.nodes),
                made=made,
            )
    except NetnsUnavailable as exc:
        pytest.skip(str(exc))
