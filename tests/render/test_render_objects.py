"""render() turns an RLJob into exactly the objects the design names, each one checked on its own."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from rlkube import contract as c
from rlkube.contract import Role
from rlkube.spec import parse_job
from rlkube_operator import render as r
from rlkube_operator.settings import RenderSettings

from tests.conftest import MINIMAL_JOB

SETTINGS = RenderSettings(default_image="rlkube:test")


def job(**spec: Any) -> Any:
    document = copy.deepcopy(MINIMAL_JOB)
    document["metadata"] = {"name": "cartpole", "namespace": "rl", "uid": "u-1"}
    document["spec"].update(spec)
    return parse_job(document)


def env_of(obj: dict[str, Any]) -> dict[str, Any]:
    container = obj["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def by_kind_name(objects: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}


def test_a_job_renders_config_map_three_services_two_statefulsets_and_a_train_budget() -> None:
    objects = by_kind_name(r.render(job(), SETTINGS))
    assert set(objects) == {
        ("ConfigMap", "cartpole-job"),
        ("Service", "cartpole-train"),
        ("Service", "cartpole-coordinator"),
        ("Service", "cartpole-eval"),
        ("StatefulSet", "cartpole-train"),
        ("StatefulSet", "cartpole-eval"),
        ("PodDisruptionBudget", "cartpole-train"),
    }


def test_every_object_is_owned_by_the_job_and_labelled() -> None:
    for obj in r.render(job(), SETTINGS):
        meta = obj["metadata"]
        assert meta["namespace"] == "rl"
        assert meta["labels"][c.LABEL_JOB] == "cartpole"
        assert meta["ownerReferences"] == [
            {
                "apiVersion": "rlkube.io/v1alpha1",
                "kind": "RLJob",
                "name": "cartpole",
                "uid": "u-1",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]


def test_a_job_without_uid_renders_without_owner_references() -> None:
    document = copy.deepcopy(MINIMAL_JOB)
    for obj in r.render(parse_job(document), SETTINGS):
        assert "ownerReferences" not in obj["metadata"]


def test_config_map_holds_the_job_without_eval_replicas() -> None:
    import yaml

    config = r.render_config_map(job(evaluator={"replicas": 7}), SETTINGS)
    document = yaml.safe_load(config["data"]["job.yaml"])
    assert document["metadata"] == {"name": "cartpole", "namespace": "rl"}
    assert "replicas" not in document["spec"]["evaluator"]
    assert parse_job(document).spec.env.id == "CartPole-v1"


def test_headless_train_service_publishes_not_ready_addresses() -> None:
    service = r.render_train_service(job(), SETTINGS)
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"] == {c.LABEL_JOB: "cartpole", c.LABEL_ROLE: "train"}
    assert {p["port"] for p in service["spec"]["ports"]} == {
        c.MASTER_PORT,
        c.COORDINATOR_PORT,
        c.WEIGHT_PORT,
        c.WEIGHT_DATA_PORT,
    }


def test_coordinator_service_selects_train_rank_zero() -> None:
    service = r.render_coordinator_service(job(), SETTINGS)
    assert service["spec"]["selector"] == {
        c.LABEL_JOB: "cartpole",
        c.LABEL_ROLE: "train",
        "statefulset.kubernetes.io/pod-name": "cartpole-train-0",
    }
    assert c.coordinator_addr("cartpole", "rl") == f"cartpole-coordinator.rl.svc:{c.COORDINATOR_PORT}"
    # Receivers reach rank 0's weight data port at the host they reached its WeightStore at.
    ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
    assert ports == {
        "coordinator": c.COORDINATOR_PORT,
        "weights": c.WEIGHT_PORT,
        "weight-data": c.WEIGHT_DATA_PORT,
    }


def test_train_pods_declare_the_weight_data_port_and_tell_the_process_its_number() -> None:
    pod = r.render_train_statefulset(job(), SETTINGS)["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert {"name": "weight-data", "containerPort": c.WEIGHT_DATA_PORT, "protocol": "TCP"} in container[
        "ports"
    ]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["RLKUBE_WEIGHT_DATA_PORT"] == str(c.WEIGHT_DATA_PORT)
    eval_env = {
        e["name"]
        for e in r.render_eval_statefulset(job(), SETTINGS)["spec"]["template"]["spec"]["containers"][0][
            "env"
        ]
    }
    assert "RLKUBE_WEIGHT_DATA_PORT" not in eval_env  # eval pods serve no weights


def test_train_statefulset_is_parallel_with_replicas_from_the_spec() -> None:
    sts = r.render_train_statefulset(job(trainer={"replicas": 4}), SETTINGS)
    assert sts["spec"]["replicas"] == 4
    assert sts["spec"]["podManagementPolicy"] == "Parallel"
    assert sts["spec"]["serviceName"] == "cartpole-train"
    assert sts["spec"]["selector"]["matchLabels"] == {c.LABEL_JOB: "cartpole", c.LABEL_ROLE: "train"}


@pytest.mark.parametrize("role", [Role.TRAIN, Role.EVAL])
def test_pods_get_exactly_the_env_contract_names_of_their_role(role: Role) -> None:
    user = [{"name": "MY_FLAG", "value": "1"}]
    spec = {"trainer": {"env": user}} if role is Role.TRAIN else {"evaluator": {"env": user}}
    sts = (r.render_train_statefulset if role is Role.TRAIN else r.render_eval_statefulset)(
        job(**spec), SETTINGS
    )
    names = [e["name"] for e in sts["spec"]["template"]["spec"]["containers"][0]["env"]]
    assert names == [*c.contract_names(role), "MY_FLAG"]


@pytest.mark.parametrize("role", [Role.TRAIN, Role.EVAL])
def test_downward_api_sources_are_the_contract_table_sources(role: Role) -> None:
    sts = (r.render_train_statefulset if role is Role.TRAIN else r.render_eval_statefulset)(job(), SETTINGS)
    env = env_of(sts)
    for var in c.ENV_CONTRACT:
        if role not in var.roles:
            continue
        if var.source.startswith("downward:"):
            assert env[var.name] == {
                "fieldRef": {"apiVersion": "v1", "fieldPath": var.source.removeprefix("downward:")}
            }
        else:
            assert isinstance(env[var.name], str), var.name


def test_rank_comes_from_the_pod_index_label() -> None:
    env = env_of(r.render_train_statefulset(job(), SETTINGS))
    index = {"fieldRef": {"apiVersion": "v1", "fieldPath": f"metadata.labels['{c.LABEL_POD_INDEX}']"}}
    assert env["RANK"] == env["PET_NODE_RANK"] == env["RLKUBE_REPLICA_INDEX"] == index


def test_train_env_has_master_address_world_size_and_torchrun_names() -> None:
    env = env_of(r.render_train_statefulset(job(trainer={"replicas": 3}), SETTINGS))
    assert env["MASTER_ADDR"] == env["PET_MASTER_ADDR"] == "cartpole-train-0.cartpole-train.rl.svc"
    assert env["MASTER_PORT"] == env["PET_MASTER_PORT"] == str(c.MASTER_PORT)
    assert env["WORLD_SIZE"] == env["PET_NNODES"] == "3"
    assert env["PET_NPROC_PER_NODE"] == "1"
    assert env["RLKUBE_COORDINATOR_ADDR"] == c.coordinator_addr("cartpole", "rl")


def test_backend_is_gloo_without_gpus_and_nccl_with_them() -> None:
    assert env_of(r.render_train_statefulset(job(), SETTINGS))["RLKUBE_BACKEND"] == "gloo"
    gpu = job(trainer={"resources": {"limits": {"nvidia.com/gpu": 1}}})
    assert env_of(r.render_train_statefulset(gpu, SETTINGS))["RLKUBE_BACKEND"] == "nccl"


def test_pods_run_rlkube_pod_under_the_images_entrypoint_with_the_default_image() -> None:
    container = r.render_eval_statefulset(job(), SETTINGS)["spec"]["template"]["spec"]["containers"][0]
    # args, not command: the image's ENTRYPOINT (tini -- rlkube) stays, so tini is PID 1.
    assert container["args"] == ["pod"]
    assert "command" not in container
    assert container["image"] == "rlkube:test"
    assert (
        r.render_eval_statefulset(job(image="me/rl:1"), SETTINGS)["spec"]["template"]["spec"]["containers"][
            0
        ]["image"]
        == "me/rl:1"
    )


def volumes_and_mounts(obj: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    pod = obj["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in pod["containers"][0]["volumeMounts"]}
    return volumes, mounts


def test_train_pods_get_an_in_memory_dev_shm_and_the_job_config() -> None:
    volumes, mounts = volumes_and_mounts(r.render_train_statefulset(job(), SETTINGS))
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory"}
    assert mounts["/dev/shm"] == "dshm"
    assert mounts["/etc/rlkube"] == "job-config"
    assert volumes["job-config"]["configMap"]["name"] == "cartpole-job"


def test_double_strategy_gives_each_eval_pod_an_in_memory_buffer_with_a_size_limit() -> None:
    spec = {"policy": {"weightBuffer": {"strategy": "Double", "shmSizeLimit": "2Gi"}}}
    volumes, mounts = volumes_and_mounts(r.render_eval_statefulset(job(**spec), SETTINGS))
    assert volumes["weights"] == {"name": "weights", "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}}
    assert mounts[c.SHM_DIR] == "weights"


@pytest.mark.parametrize("strategy", ["Shared", "Sharded"])
def test_shared_strategies_mount_one_host_directory_per_job_and_node(strategy: str) -> None:
    spec = {"policy": {"weightBuffer": {"strategy": strategy, "hostPath": "/dev/shm/rlkube/"}}}
    volumes, mounts = volumes_and_mounts(r.render_eval_statefulset(job(**spec), SETTINGS))
    assert volumes["weights"]["hostPath"] == {
        "path": "/dev/shm/rlkube/rl-cartpole",
        "type": "DirectoryOrCreate",
    }
    assert mounts[c.SHM_DIR] == "weights"


def test_none_strategy_has_no_weight_volume() -> None:
    volumes, mounts = volumes_and_mounts(
        r.render_eval_statefulset(job(policy={"weightBuffer": {"strategy": "None"}}), SETTINGS)
    )
    assert "weights" not in volumes
    assert c.SHM_DIR not in mounts


def test_checkpoint_claim_replaces_the_run_dir_empty_dir() -> None:
    volumes, mounts = volumes_and_mounts(
        r.render_train_statefulset(job(checkpoint={"claimName": "runs"}), SETTINGS)
    )
    assert volumes["run"]["persistentVolumeClaim"] == {"claimName": "runs"}
    assert mounts[c.RUN_DIR] == "run"


def test_pod_settings_pass_through() -> None:
    trainer = {
        "resources": {"limits": {"nvidia.com/gpu": 2, "memory": "8Gi"}, "requests": {"cpu": 0.5}},
        "nodeSelector": {"pool": "gpu"},
        "tolerations": [{"key": "spot", "operator": "Exists"}],
        "affinity": {"nodeAffinity": {}},
        "priorityClassName": "high",
        "schedulerName": "volcano",
        "serviceAccountName": "trainer",
        "imagePullPolicy": "Always",
        "labels": {"team": "rl"},
        "annotations": {"note": "x"},
    }
    template = r.render_train_statefulset(job(trainer=trainer), SETTINGS)["spec"]["template"]
    pod = template["spec"]
    container = pod["containers"][0]
    assert container["resources"] == {
        "limits": {"nvidia.com/gpu": "2", "memory": "8Gi"},
        "requests": {"cpu": "0.5"},
    }
    assert container["imagePullPolicy"] == "Always"
    assert pod["nodeSelector"] == {"pool": "gpu"}
    assert pod["tolerations"] == [
        {"key": "spot", "operator": "Exists"},
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
    ]
    assert pod["affinity"] == {"nodeAffinity": {}}
    assert (pod["priorityClassName"], pod["schedulerName"], pod["serviceAccountName"]) == (
        "high",
        "volcano",
        "trainer",
    )
    assert template["metadata"]["labels"]["team"] == "rl"
    assert template["metadata"]["annotations"]["note"] == "x"


def test_gpu_tolerations_are_added_only_to_pods_that_ask_for_gpus() -> None:
    pod = r.render_eval_statefulset(job(), SETTINGS)["spec"]["template"]["spec"]
    assert "tolerations" not in pod


def test_operator_defaults_apply_under_the_jobs_own_settings() -> None:
    settings = RenderSettings(
        default_node_selector={"pool": "cpu", "zone": "a"}, image_pull_policy="IfNotPresent"
    )
    pod = r.render_eval_statefulset(job(evaluator={"nodeSelector": {"pool": "big"}}), settings)["spec"][
        "template"
    ]
    assert pod["spec"]["nodeSelector"] == {"pool": "big", "zone": "a"}
    assert pod["spec"]["containers"][0]["imagePullPolicy"] == "IfNotPresent"


def test_user_labels_cannot_override_the_selector_labels() -> None:
    template = r.render_eval_statefulset(job(evaluator={"labels": {c.LABEL_ROLE: "train"}}), SETTINGS)[
        "spec"
    ]["template"]
    assert template["metadata"]["labels"][c.LABEL_ROLE] == "eval"


def test_eval_pods_get_a_grace_period_for_draining() -> None:
    settings = RenderSettings(eval_grace_seconds=120)
    assert (
        r.render_eval_statefulset(job(), settings)["spec"]["template"]["spec"][
            "terminationGracePeriodSeconds"
        ]
        == 120
    )


def test_scaling_eval_changes_only_eval_replicas_and_no_hash() -> None:
    before = r.render(job(evaluator={"replicas": 1}), SETTINGS)
    after = r.render(job(evaluator={"replicas": 5}), SETTINGS)
    changed = [(a["kind"], a["metadata"]["name"]) for a, b in zip(before, after, strict=True) if a != b]
    assert changed == [("StatefulSet", "cartpole-eval")]
    eval_after = by_kind_name(after)[("StatefulSet", "cartpole-eval")]
    eval_before = copy.deepcopy(by_kind_name(before)[("StatefulSet", "cartpole-eval")])
    eval_before["spec"]["replicas"] = 5
    assert eval_after == eval_before


def test_a_spec_change_changes_the_hash_on_pod_templates() -> None:
    a = r.render_train_statefulset(job(), SETTINGS)
    b = r.render_train_statefulset(job(train={"maxEpochs": 3}), SETTINGS)
    key = r.ANNOTATION_SPEC_HASH
    assert (
        a["spec"]["template"]["metadata"]["annotations"][key]
        != b["spec"]["template"]["metadata"]["annotations"][key]
    )


def test_stopped_scales_both_statefulsets_to_zero() -> None:
    objects = by_kind_name(r.render(job(evaluator={"replicas": 3}), SETTINGS, stopped=True))
    assert objects["StatefulSet", "cartpole-train"]["spec"]["replicas"] == 0
    assert objects["StatefulSet", "cartpole-eval"]["spec"]["replicas"] == 0


def test_network_policy_admits_only_the_jobs_pods_and_the_operator() -> None:
    settings = RenderSettings(
        network_policy=True, operator_namespace="ops", operator_pod_labels={"app": "op"}
    )
    objects = by_kind_name(r.render(job(), settings))
    policy = objects["NetworkPolicy", "cartpole-train"]["spec"]
    assert policy["podSelector"]["matchLabels"] == {c.LABEL_JOB: "cartpole", c.LABEL_ROLE: "train"}
    own, operator, metrics = policy["ingress"]
    # Only pods the operator rendered carry rlkube.io/job-pod (the CRD refuses it in user overrides).
    job_pods = {c.LABEL_JOB: "cartpole", c.LABEL_JOB_POD: "cartpole"}
    assert own["from"] == [{"podSelector": {"matchLabels": job_pods}}]
    assert {p["port"] for p in own["ports"]} == {
        c.MASTER_PORT,
        c.COORDINATOR_PORT,
        c.WEIGHT_PORT,
        c.WEIGHT_DATA_PORT,
    }
    assert operator["from"][0]["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "ops"}
    assert operator["ports"] == [{"protocol": "TCP", "port": c.COORDINATOR_PORT}]
    # The one port open to anyone: read-only Prometheus metrics, for whatever scrapes the cluster.
    assert metrics == {"ports": [{"protocol": "TCP", "port": c.METRICS_PORT}]}
