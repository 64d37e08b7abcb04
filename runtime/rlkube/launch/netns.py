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

:func:`link_local_nodes` makes such namespaces for a test or a benchmark (root only): N nodes,
each on one end of a veth pair whose other end is in a bridge in the caller's namespace, holding
link-local addresses (``169.254.S.i+1/24``, the bridge ``169.254.S.254``), every name tagged with
a random tag; on exit everything is removed, also when the body failed (processes still in a
namespace are killed first). :meth:`LinkLocalNodes.shape` rate-limits what leaves a node (``tc``).
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


class NetnsError(RuntimeError):
    """A namespace that does not exist, has no IPv4 address, or cannot be entered."""


class NetnsUnavailable(NetnsError):
    """Namespaces or links cannot be created here (not root, no iproute2, no CAP_NET_ADMIN)."""


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


#: Tools :func:`link_local_nodes` and :meth:`LinkLocalNodes.shape` run.
TOOLS = ("ip", "tc")


@dataclass(frozen=True)
class LinkLocalNodes:
    """Namespaced nodes made by :func:`link_local_nodes`, bridged to the caller's namespace."""

    nodes: tuple[NodeNet, ...]
    #: The random tag in every name made (namespaces, links): what to look for after cleanup.
    tag: str
    bridge: str
    #: The bridge's address: how the caller's namespace reaches the nodes.
    host_address: str

    @property
    def namespaces(self) -> tuple[str, ...]:
        return tuple(node.namespace for node in self.nodes)

    @property
    def netns_arg(self) -> str:
        """The ``--netns`` argument of ``rlkube run`` for these nodes."""
        return ",".join(self.namespaces)

    def shape(self, node: int, *, rate: str, burst: str = "16kb", latency: str = "400ms") -> None:
        """Limit what leaves ``node`` to ``rate`` (a token bucket on its veth), e.g. ``"4mbit"``.

        ``burst`` must hold at least one timer tick's worth of ``rate`` (about rate / 1000 s) or
        the link runs slower than ``rate``.
        """
        net = self.nodes[node]
        _must_run(
            ["tc", "-n", net.namespace, "qdisc", "replace", "dev", net.interface, "root", "tbf",
             "rate", rate, "burst", burst, "latency", latency],
            what=f"tc on {net.namespace}",
        )  # fmt: skip

    def unshape(self, node: int) -> None:
        """Remove the limit :meth:`shape` put on ``node`` (none: nothing happens)."""
        net = self.nodes[node]
        _run(["tc", "-n", net.namespace, "qdisc", "del", "dev", net.interface, "root"])


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False)


def _must_run(argv: list[str], *, what: str) -> str:
    result = _run(argv)
    if result.returncode != 0:
        raise NetnsError(f"{what}: {' '.join(argv)}: {result.stderr.strip()}")
    return result.stdout


def unavailable_reason() -> str | None:
    """Why :func:`link_local_nodes` cannot work here (None: it can try)."""
    if os.geteuid() != 0:
        return "creating network namespaces needs root"
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        return f"creating network namespaces needs iproute2 ({', '.join(missing)} not found)"
    return None


def leftovers(tag: str) -> list[str]:
    """Namespaces and links of this namespace whose name holds ``tag`` (after cleanup: none)."""
    names = _run(["ip", "netns", "list"]).stdout.split()
    names += [
        line.split(":")[1].strip().split("@")[0] for line in _run(["ip", "-o", "link"]).stdout.splitlines()
    ]
    return [name for name in names if tag in name]


def _kill_everything_in(namespace: str) -> None:
    for pid in _run(["ip", "netns", "pids", namespace]).stdout.split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)


@contextlib.contextmanager
def link_local_nodes(count: int, *, prefix: str = "rlk") -> Iterator[LinkLocalNodes]:
    """``count`` namespaced nodes bridged to this namespace (see the module docstring).

    Raises :class:`NetnsUnavailable` where they cannot be made; everything made is removed on exit.
    """
    reason = unavailable_reason()
    if reason is not None:
        raise NetnsUnavailable(reason)
    if not 1 <= count <= 200:
        raise ValueError(f"count must be 1-200, not {count}")
    tag = secrets.token_hex(3)
    subnet = 100 + secrets.randbelow(60)  # 169.254.100-159.x: clear of 169.254.169.254
    bridge = f"{prefix}br{tag}"
    namespaces = tuple(f"{prefix}-{tag}-n{i}" for i in range(count))
    inside = tuple(f"{prefix}{tag}i{i}" for i in range(count))
    outside = tuple(f"{prefix}{tag}o{i}" for i in range(count))
    made: list[str] = []
    try:
        if _run(["ip", "link", "add", bridge, "type", "bridge"]).returncode != 0:
            raise NetnsUnavailable("cannot create a bridge here (no CAP_NET_ADMIN?)")
        for i, namespace in enumerate(namespaces):
            if _run(["ip", "netns", "add", namespace]).returncode != 0:
                raise NetnsUnavailable("`ip netns add` is not allowed here")
            made.append(namespace)
            for argv in (
                ["link", "add", outside[i], "type", "veth", "peer", "name", inside[i]],
                ["link", "set", inside[i], "netns", namespace],
                ["link", "set", outside[i], "master", bridge],
                ["link", "set", outside[i], "up"],
                ["-n", namespace, "addr", "add", f"169.254.{subnet}.{i + 1}/24", "dev", inside[i]],
                ["-n", namespace, "link", "set", inside[i], "up"],
                ["-n", namespace, "link", "set", "lo", "up"],
            ):
                _must_run(["ip", *argv], what="making a namespaced node")
        host = f"169.254.{subnet}.254"
        _must_run(["ip", "addr", "add", f"{host}/24", "dev", bridge], what="addressing the bridge")
        _must_run(["ip", "link", "set", bridge, "up"], what="bringing the bridge up")
        yield LinkLocalNodes(
            nodes=tuple(
                NodeNet(namespace=ns, address=f"169.254.{subnet}.{i + 1}", interface=inside[i])
                for i, ns in enumerate(namespaces)
            ),
            tag=tag,
            bridge=bridge,
            host_address=host,
        )
    finally:
        for namespace in made:
            _kill_everything_in(namespace)
            _run(["ip", "netns", "del", namespace])  # takes its veth end, and so the pair, with it
        for name in outside:
            _run(["ip", "link", "del", name])  # in case its namespace never got it
        _run(["ip", "link", "del", bridge])
