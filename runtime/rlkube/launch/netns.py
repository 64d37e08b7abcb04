"""``rlkube run --netns NS0,NS1``: each simulated node's processes in a network namespace of its own.

The namespaces are the user's (``ip netns add``, a veth pair or a bridge, addresses of their
choosing: docs/operations.md shows one way); rlkube only runs node ``i``'s "pods" under
``ip netns exec NSi`` (which execs, so the supervisor's pid is the pod's) and fills the env
contract with what a cluster would: every server of a node binds that node's address, the
coordinator and the weight servers are reached at node 0's address (train ranks live on node 0),
and gloo is told the node's interface (``GLOO_SOCKET_IFNAME``), since a namespace's host name does
not resolve to it. ``rlkube run`` itself stays where it was started and must reach node 0's
address (a bridge in its namespace does that).

:func:`parse_addresses` is pure; :func:`discover` asks ``ip`` (needs the right to enter
namespaces: root, or CAP_SYS_ADMIN).
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass


class NetnsError(RuntimeError):
    """A namespace that does not exist, has no IPv4 address, or cannot be entered."""


@dataclass(frozen=True)
class NodeNet:
    """Where one simulated node lives: its namespace, its address and the interface holding it."""

    namespace: str
    address: str
    interface: str

    def exec_prefix(self) -> list[str]:
        """What runs a command in this node's namespace (``ip netns exec`` execs it)."""
        return ["ip", "netns", "exec", self.namespace]


def parse_addresses(text: str) -> list[tuple[str, str]]:
    """(interface, IPv4 address) of every non-loopback address in ``ip -o -4 addr show`` output."""
    found = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 4 or fields[2] != "inet":
            continue
        interface, address = fields[1].split("@")[0], fields[3].split("/")[0]
        if interface != "lo" and not address.startswith("127."):
            found.append((interface, address))
    return found


def discover(namespace: str) -> NodeNet:
    """The first IPv4 address (and its interface) of ``namespace``; :class:`NetnsError` if none."""
    ip = shutil.which("ip")
    if ip is None:
        raise NetnsError("--netns needs the `ip` command (iproute2)")
    result = subprocess.run(
        [ip, "-n", namespace, "-o", "-4", "addr", "show", "up"],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise NetnsError(f"network namespace {namespace!r}: {result.stderr.strip() or 'cannot be read'}")
    addresses = parse_addresses(result.stdout)
    if not addresses:
        raise NetnsError(f"network namespace {namespace!r} has no IPv4 address on an interface that is up")
    interface, address = addresses[0]
    return NodeNet(namespace=namespace, address=address, interface=interface)


def discover_all(spec: str) -> tuple[NodeNet, ...]:
    """``NS0,NS1,...`` (one per node, node 0 first) as :class:`NodeNet` s."""
    names = [name.strip() for name in spec.split(",") if name.strip()]
    if not names:
        raise NetnsError("--netns needs at least one namespace name")
    if len(set(names)) != len(names):
        raise NetnsError(f"--netns names a namespace twice: {spec}")
    return tuple(discover(name) for name in names)
