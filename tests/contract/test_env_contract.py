"""One env contract: the table in code, the page in docs/, the local launcher and the pod entrypoint agree."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rlkube.contract import (
    ENV_CONTRACT,
    EnvContractError,
    PodIdentity,
    Role,
    TrainRendezvous,
    build_pod_env,
    contract_names,
    read_pod_env,
)
from rlkube.launch.local import Layout, Ports, pod_env
from rlkube.spec import parse_job

from tests.conftest import MINIMAL_JOB

ROOT = Path(__file__).resolve().parents[2]


def local_layout(tmp_path: Path, *, train: int = 2, evals: int = 3, nodes: int = 2) -> Layout:
    job = parse_job(
        {
            **MINIMAL_JOB,
            "spec": {**MINIMAL_JOB["spec"], "trainer": {"replicas": train}, "evaluator": {"replicas": evals}},
        }
    )
    return Layout(
        job=job, run_dir=tmp_path, shm_root=tmp_path / "shm", nodes=nodes, ports=Ports(1, 2, (3, 4))
    )


def test_the_doc_lists_exactly_the_contract_with_its_roles_and_sources() -> None:
    text = (ROOT / "docs" / "env-contract.md").read_text()
    rows = re.findall(r"^\| `([A-Z_]+)` \| ([a-z, ]+) \| ([^|]+) \|", text, flags=re.M)
    documented = {name: (roles.strip(), source.strip()) for name, roles, source in rows}
    assert set(documented) == {var.name for var in ENV_CONTRACT}
    for var in ENV_CONTRACT:
        roles, source = documented[var.name]
        assert roles == ", ".join(r.value for r in var.roles), var.name
        if var.source.startswith("downward:"):
            assert var.source.removeprefix("downward:") in source, var.name


@pytest.mark.parametrize("role", [Role.TRAIN, Role.EVAL])
def test_the_local_launcher_sets_exactly_the_contract(tmp_path: Path, role: Role) -> None:
    env = pod_env(local_layout(tmp_path), role, 1)
    assert sorted(env) == sorted(contract_names(role))


def test_what_the_launcher_sets_reads_back_as_the_pod_it_describes(tmp_path: Path) -> None:
    layout = local_layout(tmp_path)
    train = read_pod_env(pod_env(layout, Role.TRAIN, 1))
    assert (train.role, train.rank, train.world_size, train.replica_index) == (Role.TRAIN, 1, 2, 1)
    assert train.pod_name == "cartpole-train-1"
    assert train.node_name == "node-0"
    evaluator = read_pod_env(pod_env(layout, Role.EVAL, 1))
    assert (evaluator.role, evaluator.replica_index, evaluator.node_name) == (Role.EVAL, 1, "node-1")
    assert evaluator.shm_dir == tmp_path / "shm" / "node-1"
    assert evaluator.coordinator_addr == train.coordinator_addr == "127.0.0.1:2"


def test_eval_replicas_are_spread_over_the_simulated_nodes_and_trainers_share_node_zero(
    tmp_path: Path,
) -> None:
    layout = local_layout(tmp_path, evals=3, nodes=2)
    assert [layout.node_of(Role.EVAL, i) for i in range(3)] == [0, 1, 0]
    assert {layout.node_of(Role.TRAIN, r) for r in range(2)} == {0}


def test_a_missing_and_a_malformed_variable_are_both_named() -> None:
    env = pod_env(local_layout(Path("/tmp")), Role.TRAIN, 0)
    del env["WORLD_SIZE"]
    env["RLKUBE_REPLICA_INDEX"] = "zero"
    with pytest.raises(EnvContractError) as caught:
        read_pod_env(env)
    assert "RLKUBE_REPLICA_INDEX='zero' is not an integer" in str(caught.value)
    env["RLKUBE_REPLICA_INDEX"] = "0"
    with pytest.raises(EnvContractError, match="WORLD_SIZE is not set"):
        read_pod_env(env)


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("RLKUBE_ROLE", "trainer", "RLKUBE_ROLE='trainer' must be 'train' or 'eval'"),
        ("RLKUBE_COORDINATOR_ADDR", "nowhere", "must be host:port"),
        ("RANK", "5", "RANK=5 must be < WORLD_SIZE=2"),
        ("RLKUBE_BACKEND", "mpi", "RLKUBE_BACKEND='mpi' must be 'nccl' or 'gloo'"),
    ],
)
def test_malformed_values_are_refused_with_the_variable_named(name: str, value: str, message: str) -> None:
    env = pod_env(local_layout(Path("/tmp")), Role.TRAIN, 0)
    env[name] = value
    with pytest.raises(EnvContractError, match=re.escape(message)):
        read_pod_env(env)


def test_the_pod_entrypoint_exits_2_naming_the_broken_variable() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLKUBE_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "runtime"), str(ROOT / "operator")])
    env["RLKUBE_ROLE"] = "eval"
    result = subprocess.run(
        [sys.executable, "-m", "rlkube.launch.pod"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "RLKUBE_JOB_NAME is not set" in result.stderr
    assert "RLKUBE_COORDINATOR_ADDR is not set" in result.stderr


RENDEZVOUS = TrainRendezvous(world_size=2, backend="gloo", master_addr="m", master_port=5, weight_data_port=0)


def _built(role: Role, *, identity: PodIdentity | None, train: TrainRendezvous | None) -> dict[str, str]:
    return build_pod_env(
        role,
        job_name="j",
        coordinator_addr="c:1",
        shm_dir="/shm",
        run_dir="/run",
        job_config="/job.yaml",
        weight_port=2,
        metrics_port=0,
        token_file="/token",
        listen_host="127.0.0.1",
        train=train,
        identity=identity,
    )


@pytest.mark.parametrize("role", [Role.TRAIN, Role.EVAL])
def test_the_builder_leaves_the_downward_rows_to_kubernetes_unless_given_an_identity(role: Role) -> None:
    downward = {var.name for var in ENV_CONTRACT if var.source.startswith("downward:")}
    train = RENDEZVOUS if role is Role.TRAIN else None
    in_cluster = _built(role, identity=None, train=train)
    assert list(in_cluster) == [name for name in contract_names(role) if name not in downward]
    identity = PodIdentity(namespace="ns", replica_index=1, pod_name="p", node_name="n")
    local = _built(role, identity=identity, train=train)
    assert list(local) == list(contract_names(role))


def test_rank_and_the_torchrun_names_are_spelt_from_the_replica_index_and_the_rendezvous() -> None:
    identity = PodIdentity(namespace="ns", replica_index=1, pod_name="p", node_name="n")
    env = _built(Role.TRAIN, identity=identity, train=RENDEZVOUS)
    assert env["RANK"] == env["PET_NODE_RANK"] == env["RLKUBE_REPLICA_INDEX"] == "1"
    assert (env["PET_NNODES"], env["PET_MASTER_ADDR"], env["PET_MASTER_PORT"]) == ("2", "m", "5")
    with pytest.raises(ValueError, match="rendezvous"):
        _built(Role.TRAIN, identity=identity, train=None)
