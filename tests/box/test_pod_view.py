"""What a rendered RLJob pod gets from the process kubelet: paths on its node, addresses on 127.0.0.1.

Pure: render's StatefulSets -> the StatefulSet controller's pods -> the kubelet's env rewriting;
the result must read back through the pods' own contract parser (``read_pod_env``).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import logging
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from rlkube import contract as c
from rlkube.contract import Role, read_pod_env
from rlkube.spec import parse_job
from rlkube_devcluster.kubelet.downward import pod_environment
from rlkube_devcluster.kubelet.podnet import JobPorts, ServiceProxy, cluster_addresses
from rlkube_devcluster.kubelet.sandbox import (
    IMAGE_ENTRYPOINT,
    Node,
    PodSandbox,
    SandboxError,
    container_command,
)
from rlkube_operator.render import render_eval_statefulset, render_train_statefulset
from rlkube_operator.settings import RenderSettings

from tests.conftest import MINIMAL_JOB
from tests.delivery.test_dockerfile import FINAL

SETTINGS = RenderSettings(default_image="rlkube:test")


def job(**spec: Any) -> Any:
    document = copy.deepcopy(MINIMAL_JOB)
    document["metadata"] = {"name": "cp", "namespace": "rl", "uid": "u-1"}
    document["spec"].update({"trainer": {"replicas": 2}, "evaluator": {"replicas": 2}, **spec})
    return parse_job(document)


def pod_of(sts: dict[str, Any], ordinal: int, node: str) -> dict[str, Any]:
    """Pod ``ordinal`` of ``sts`` as the StatefulSet controller makes it, bound to ``node``."""
    template = copy.deepcopy(sts["spec"]["template"])
    name = f"{sts['metadata']['name']}-{ordinal}"
    labels = {**template["metadata"].get("labels", {}), c.LABEL_POD_INDEX: str(ordinal)}
    labels["statefulset.kubernetes.io/pod-name"] = name
    spec = {
        **template["spec"],
        "hostname": name,
        "subdomain": sts["spec"].get("serviceName"),
        "nodeName": node,
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "rl",
            "uid": f"pod-{ordinal}",
            "labels": labels,
            "annotations": template["metadata"].get("annotations", {}),
        },
        "spec": spec,
    }


def node(tmp_path: Path, name: str) -> Node:
    return Node(name, tmp_path / "disk" / name, tmp_path / "shm" / name)


def container_env(
    pod: dict[str, Any], sandbox: PodSandbox, ports: JobPorts
) -> tuple[dict[str, Any], dict[str, str]]:
    container = pod["spec"]["containers"][0]
    env = sandbox.rewrite_paths(container, pod_environment(pod, container))
    return container, cluster_addresses(env, job="cp", namespace="rl", ports=ports)


def test_train_ranks_reach_each_other_and_the_coordinator_on_loopback_with_ports_of_their_own(
    tmp_path: Path,
) -> None:
    sts = render_train_statefulset(job(), SETTINGS)
    ports = JobPorts(coordinator=41001, master=41002)
    envs = {}
    for rank in (0, 1):
        pod = pod_of(sts, rank, "node-0")
        _, env = container_env(pod, PodSandbox(pod, node(tmp_path, "node-0"), tmp_path / "claims"), ports)
        envs[rank] = read_pod_env(env)  # the pod's own parser accepts what the kubelet hands it
    for rank, pod_env in envs.items():
        assert (pod_env.rank, pod_env.world_size) == (rank, 2)
        assert (pod_env.master_addr, pod_env.master_port) == ("127.0.0.1", 41002)
        assert pod_env.coordinator_addr == "127.0.0.1:41001"
    assert envs[0].weight_port != envs[1].weight_port  # every rank serves weights on the one host
    assert ports.weights == {0: envs[0].weight_port, 1: envs[1].weight_port}


def test_eval_pods_find_rank_zero_and_share_their_node_buffer_under_shared(tmp_path: Path) -> None:
    sts = render_eval_statefulset(
        job(policy={"type": "PPO", "weightBuffer": {"strategy": "Shared"}}), SETTINGS
    )
    ports = JobPorts(coordinator=41001, master=41002, weights={0: 41003})
    shm_dirs = {}
    for ordinal, node_name in ((0, "node-0"), (1, "node-1"), (2, "node-0")):
        pod = pod_of(sts, ordinal, node_name)
        sandbox = PodSandbox(pod, node(tmp_path, node_name), tmp_path / "claims")
        _, env = container_env(pod, sandbox, ports)
        pod_env = read_pod_env(env)
        assert pod_env.weight_port == 41003
        assert pod_env.coordinator_addr == "127.0.0.1:41001"
        assert pod_env.node_name == node_name
        shm_dirs[ordinal] = pod_env.shm_dir
    # The hostPath is the node's: the same directory for pods on one node, another on the other node.
    assert shm_dirs[0] == shm_dirs[2] == tmp_path / "shm" / "node-0" / "host" / "dev/shm/rlkube/rl-cp"
    assert shm_dirs[1] == tmp_path / "shm" / "node-1" / "host" / "dev/shm/rlkube/rl-cp"


def test_double_buffers_and_run_dirs_are_per_pod_and_a_claim_is_shared(tmp_path: Path) -> None:
    sts = render_eval_statefulset(
        job(policy={"type": "PPO", "weightBuffer": {"strategy": "Double"}}), SETTINGS
    )
    envs = []
    for ordinal in (0, 1):
        pod = pod_of(sts, ordinal, "node-0")
        sandbox = PodSandbox(pod, node(tmp_path, "node-0"), tmp_path / "claims")
        envs.append(read_pod_env(container_env(pod, sandbox, JobPorts(1, 2))[1]))
        assert envs[-1].shm_dir.is_relative_to(sandbox.memory_dir)  # emptyDir medium Memory
        assert envs[-1].run_dir.is_relative_to(sandbox.disk_dir)
        assert envs[-1].job_config == sandbox.disk_dir / "volumes" / "job-config" / "job.yaml"
    assert envs[0].shm_dir != envs[1].shm_dir
    assert envs[0].run_dir != envs[1].run_dir

    claimed = render_train_statefulset(job(checkpoint={"claimName": "runs"}), SETTINGS)
    run_dirs = set()
    for rank, node_name in ((0, "node-0"), (1, "node-1")):
        pod = pod_of(claimed, rank, node_name)
        sandbox = PodSandbox(pod, node(tmp_path, node_name), tmp_path / "claims")
        run_dirs.add(read_pod_env(container_env(pod, sandbox, JobPorts(1, 2))[1]).run_dir)
    assert run_dirs == {tmp_path / "claims" / "rl" / "runs"}


def test_the_container_runs_the_image_entrypoint_with_its_args() -> None:
    pod = pod_of(render_train_statefulset(job(), SETTINGS), 0, "node-0")
    assert container_command(pod["spec"]["containers"][0], python="/py") == ["/py", "-m", "rlkube.cli", "pod"]
    assert container_command({"command": ["python3", "-c", "x"]}, python="/py") == ["/py", "-c", "x"]
    assert container_command({"command": ["/bin/true"], "args": ["a"]}) == ["/bin/true", "a"]
    assert container_command({"args": ["--help"]}, python=sys.executable)[-1] == "--help"


def test_the_box_runs_what_the_image_runs_after_tini() -> None:
    (entrypoint,) = FINAL.values("ENTRYPOINT")
    argv = json.loads(entrypoint)
    assert argv[:2] == ["/usr/bin/tini", "--"]  # left out here: the kubelet signals the process group
    assert tuple(argv[2:]) == IMAGE_ENTRYPOINT


def test_a_volume_the_box_cannot_make_is_named_in_the_error(tmp_path: Path) -> None:
    pod = {
        "metadata": {"name": "p", "namespace": "n", "uid": "u"},
        "spec": {"volumes": [{"name": "v", "nfs": {}}]},
    }
    with pytest.raises(SandboxError, match="volume v: nfs is not emulated"):
        PodSandbox(pod, node(tmp_path, "node-0"), tmp_path / "claims")


def test_rendered_env_names_only_service_addresses_the_box_rewrites() -> None:
    """Every address-like value render writes is one the kubelet maps (a new one would silently leak DNS)."""
    for sts in (render_train_statefulset(job(), SETTINGS), render_eval_statefulset(job(), SETTINGS)):
        pod = pod_of(sts, 1, "node-0")
        env = pod_environment(pod, pod["spec"]["containers"][0])
        rewritten = cluster_addresses(env, job="cp", namespace="rl", ports=JobPorts(1, 2))
        leftover = {k: v for k, v in rewritten.items() if ".svc" in v}
        assert leftover == {}
        ports = {str(p) for p in (c.MASTER_PORT, c.COORDINATOR_PORT, c.WEIGHT_PORT)}
        assert not {k: v for k, v in rewritten.items() if v in ports}
        assert rewritten["RLKUBE_ROLE"] in (Role.TRAIN.value, Role.EVAL.value)


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def proxied(
    upstream_handler: Handler, path: Path
) -> AsyncIterator[tuple[ServiceProxy, asyncio.StreamReader, asyncio.StreamWriter]]:
    """A client connected through a ServiceProxy at ``path`` to a server running ``upstream_handler``."""
    upstream = await asyncio.start_server(upstream_handler, "127.0.0.1", 0)
    proxy = await ServiceProxy(path, upstream.sockets[0].getsockname()[1]).start()
    try:
        reader, writer = await asyncio.open_unix_connection(str(path))
        try:
            yield proxy, reader, writer
        finally:
            writer.close()
    finally:
        await proxy.close()
        upstream.close()


def test_the_service_proxy_forwards_a_unix_socket_to_the_port(tmp_path: Path) -> None:
    async def scenario() -> bytes:
        async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(await reader.readline())
            await writer.drain()
            writer.close()

        async with proxied(echo, tmp_path / "s.sock") as (_, reader, writer):
            writer.write(b"ping\n")
            return await asyncio.wait_for(reader.readline(), 10)

    assert asyncio.run(scenario()) == b"ping\n"
    assert not (tmp_path / "s.sock").exists()


def test_closing_the_service_proxy_ends_its_open_connections_without_logging_an_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def scenario() -> bytes:
        held = asyncio.Event()

        async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            held.set()
            await reader.read()  # until the proxy hangs up

        async with proxied(hold, tmp_path / "s.sock") as (proxy, reader, _):
            await asyncio.wait_for(held.wait(), 10)
            await proxy.close()  # with the connection open
            return await asyncio.wait_for(reader.read(), 10)

    with caplog.at_level(logging.ERROR):
        assert asyncio.run(scenario()) == b""  # the client sees the connection end
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
