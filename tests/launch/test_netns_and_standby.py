"""``rlkube run --netns`` fills the env contract per node; ``--standby`` starts a warm train rank on "go"."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from rlkube.contract import Role, read_pod_env
from rlkube.launch.local import Layout, Ports, pod_env
from rlkube.launch.netns import NodeNet, parse_addresses
from rlkube.launch.processes import STANDBY_ENV, standby_can_go, standby_is_ready

from tests.engine.jobs import tiny_job

IP_OUTPUT = """\
1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever preferred_lft forever
7: veth0@if8    inet 169.254.120.1/24 scope global veth0\\       valid_lft forever preferred_lft forever
"""


def test_a_namespace_address_is_its_first_non_loopback_ipv4() -> None:
    assert parse_addresses(IP_OUTPUT) == [("veth0", "169.254.120.1")]
    assert parse_addresses("") == []


def layout(tmp_path: Path) -> Layout:
    nodes = (NodeNet("ns-a", "169.254.120.1", "veth0"), NodeNet("ns-b", "169.254.120.2", "veth1"))
    return Layout(
        job=tiny_job(),
        run_dir=tmp_path,
        shm_root=tmp_path / "shm",
        nodes=2,
        ports=Ports(5, 6, (7,)),
        netns=nodes,
    )


def test_pods_in_namespaces_reach_rank_0_at_node_0s_address_and_bind_their_own(tmp_path: Path) -> None:
    where = layout(tmp_path)
    train = pod_env(where, Role.TRAIN, 0)
    far_worker = pod_env(where, Role.EVAL, 1)  # eval replica 1 lives on node 1
    assert (
        read_pod_env(train).coordinator_addr == read_pod_env(far_worker).coordinator_addr == "169.254.120.1:6"
    )
    assert train["MASTER_ADDR"] == "169.254.120.1"
    assert (train["RLKUBE_LISTEN_HOST"], train["GLOO_SOCKET_IFNAME"]) == ("169.254.120.1", "veth0")
    assert (far_worker["RLKUBE_LISTEN_HOST"], far_worker["GLOO_SOCKET_IFNAME"]) == ("169.254.120.2", "veth1")
    assert where.exec_prefix(Role.EVAL, 1)[-1] == "ns-b"
    assert where.exec_prefix(Role.TRAIN, 0)[-1] == "ns-a"


def test_without_namespaces_everything_stays_on_loopback(tmp_path: Path) -> None:
    plain = Layout(
        job=tiny_job(), run_dir=tmp_path, shm_root=tmp_path / "shm", nodes=2, ports=Ports(5, 6, (7,))
    )
    env = pod_env(plain, Role.EVAL, 1)
    assert env["RLKUBE_COORDINATOR_ADDR"] == "127.0.0.1:6"
    assert "GLOO_SOCKET_IFNAME" not in env
    assert plain.exec_prefix(Role.EVAL, 1) == []


STANDBY = textwrap.dedent(
    """
    import sys
    from rlkube.launch.processes import wait_as_standby
    went = wait_as_standby({"RLKUBE_STANDBY_FILE": sys.argv[1]}, lambda: print("warm", flush=True))
    print("go" if went else "not needed", flush=True)
    """
)


def start_standby(ready: Path) -> subprocess.Popen[str]:
    env = {**os.environ, STANDBY_ENV: str(ready)}
    return subprocess.Popen(
        [sys.executable, "-c", STANDBY, str(ready)], stdout=subprocess.PIPE, text=True, env=env
    )


def test_a_standby_warms_up_then_starts_on_sigusr1(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    proc = start_standby(ready)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "warm"  # it printed this after saying it waits
    assert standby_can_go(ready, proc.pid)
    os.kill(proc.pid, signal.SIGUSR1)  # before or after it reached sigwait: it waits for it
    out, _ = proc.communicate(timeout=30)
    assert out.strip() == "go"
    assert proc.returncode == 0
    assert standby_is_ready(ready, proc.pid)


def test_a_standby_that_is_not_needed_stops_on_sigterm(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    proc = start_standby(ready)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "warm"
    os.kill(proc.pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert out.strip() == "not needed"
    assert not standby_can_go(ready, proc.pid + 1)  # the file names only its own process
