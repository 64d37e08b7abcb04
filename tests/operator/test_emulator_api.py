"""The API emulator keeps the API server's rules that kopf and kubectl rely on (and stock kmock lacks)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rlkube_devcluster.emulator.cluster import EmulatedCluster
from rlkube_devcluster.emulator.controllers import pod_environment
from rlkube_devcluster.waiting import wait_for

from tests.operator.harness import ROOT, kubectl

STS = "/apis/apps/v1/namespaces/default/statefulsets"
CM = "/api/v1/namespaces/default/configmaps"
RLJ = "/apis/rlkube.io/v1alpha1/namespaces/default/rljobs"


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatedCluster]:
    cluster = EmulatedCluster(tmp_path_factory.mktemp("api"), crds=[ROOT / "crds" / "rljob.yaml"]).start()
    yield cluster
    cluster.stop()


def call(
    cluster: EmulatedCluster,
    method: str,
    path: str,
    body: Any = None,
    *,
    content_type: str = "application/json",
) -> tuple[int, Any]:
    data = None
    if body is not None:
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
    request = urllib.request.Request(cluster.url + path, data=data, method=method)
    request.add_header("Content-Type", content_type)
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read() or b"null")
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")


def statefulset(name: str, replicas: int = 1, **extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name, **extra},
        "spec": {
            "replicas": replicas,
            "serviceName": name,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "main", "image": "x"}, {"name": "side", "image": "y"}]},
            },
        },
    }


def test_create_answers_201_with_server_set_fields(api: EmulatedCluster) -> None:
    status, obj = call(api, "POST", CM, {"metadata": {"name": "a"}, "data": {"k": "v"}})
    assert status == 201
    meta = obj["metadata"]
    assert meta["uid"]
    assert meta["resourceVersion"].isdigit()
    assert meta["creationTimestamp"].endswith("Z")
    assert meta["namespace"] == "default"
    status, again = call(api, "POST", CM, {"metadata": {"name": "a"}})
    assert (status, again["reason"]) == (409, "AlreadyExists")


def test_generate_name_gets_a_random_suffix(api: EmulatedCluster) -> None:
    _, obj = call(api, "POST", CM, {"metadata": {"generateName": "gen-"}})
    assert obj["metadata"]["name"].startswith("gen-")
    assert len(obj["metadata"]["name"]) == len("gen-") + 5


def test_namespace_paths_parse(api: EmulatedCluster) -> None:
    status, namespaces = call(api, "GET", "/api/v1/namespaces")
    assert status == 200
    assert {"default", "kube-system"} <= {n["metadata"]["name"] for n in namespaces["items"]}
    status, one = call(api, "GET", "/api/v1/namespaces/default")
    assert (status, one["kind"]) == (200, "Namespace")
    status, _ = call(api, "POST", "/api/v1/namespaces/nowhere/configmaps", {"metadata": {"name": "x"}})
    assert status == 404


def test_put_needs_the_current_resource_version(api: EmulatedCluster) -> None:
    _, obj = call(api, "POST", CM, {"metadata": {"name": "put"}, "data": {"a": "1"}})
    stale = json.loads(json.dumps(obj))
    obj["data"] = {"a": "2"}
    status, updated = call(api, "PUT", f"{CM}/put", obj)
    assert status == 200
    assert int(updated["metadata"]["resourceVersion"]) > int(obj["metadata"]["resourceVersion"])
    stale["data"] = {"a": "3"}
    status, conflict = call(api, "PUT", f"{CM}/put", stale)
    assert (status, conflict["reason"]) == (409, "Conflict")


def test_json_patch_test_operation_guards_the_resource_version(api: EmulatedCluster) -> None:
    _, obj = call(api, "POST", CM, {"metadata": {"name": "jp"}})
    ops = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "1"},
        {"op": "add", "path": "/data", "value": {"x": "y"}},
    ]
    status, _ = call(api, "PATCH", f"{CM}/jp", ops, content_type="application/json-patch+json")
    assert status == 422
    ops[0]["value"] = obj["metadata"]["resourceVersion"]
    status, patched = call(api, "PATCH", f"{CM}/jp", ops, content_type="application/json-patch+json")
    assert (status, patched["data"]) == (200, {"x": "y"})


def test_strategic_merge_merges_containers_by_name(api: EmulatedCluster) -> None:
    call(api, "POST", STS, statefulset("smp", replicas=0))
    patch = {"spec": {"template": {"spec": {"containers": [{"name": "side", "image": "z"}]}}}}
    status, obj = call(
        api, "PATCH", f"{STS}/smp", patch, content_type="application/strategic-merge-patch+json"
    )
    assert status == 200
    images = {c["name"]: c["image"] for c in obj["spec"]["template"]["spec"]["containers"]}
    assert images == {"main": "x", "side": "z"}


def test_strategic_merge_is_refused_for_custom_resources(api: EmulatedCluster) -> None:
    call(api, "POST", RLJ, {"apiVersion": "rlkube.io/v1alpha1", "kind": "RLJob", "metadata": {"name": "smp"},
                            "spec": {"env": {"id": "X-v0"}}})  # fmt: skip
    status, _ = call(
        api, "PATCH", f"{RLJ}/smp", {"spec": {}}, content_type="application/strategic-merge-patch+json"
    )
    assert status == 415


def test_server_side_apply_creates_prunes_and_is_idempotent(api: EmulatedCluster) -> None:
    apply = "application/apply-patch+yaml"
    path = f"{CM}/ssa?fieldManager=me&force=true"
    first = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "ssa", "labels": {"a": "1", "b": "2"}},
    }
    status, created = call(api, "PATCH", path, first, content_type=apply)
    assert status == 201
    assert created["metadata"]["labels"] == {"a": "1", "b": "2"}
    status, same = call(api, "PATCH", path, first, content_type=apply)
    assert status == 200
    assert same["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]
    second = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa", "labels": {"a": "1"}}}
    _, pruned = call(api, "PATCH", path, second, content_type=apply)
    assert pruned["metadata"]["labels"] == {"a": "1"}
    status, _ = call(api, "PATCH", f"{CM}/ssa", second, content_type=apply)
    assert status == 400  # no fieldManager


def test_status_and_spec_are_written_through_their_own_endpoints(api: EmulatedCluster) -> None:
    _, obj = call(api, "POST", STS, statefulset("sub", replicas=0))
    generation = obj["metadata"]["generation"]
    merge = "application/merge-patch+json"
    _, main = call(api, "PATCH", f"{STS}/sub", {"status": {"replicas": 7}}, content_type=merge)
    assert main.get("status", {}).get("replicas") != 7
    both = {"spec": {"replicas": 9}, "status": {"replicas": 3}}
    _, status_only = call(api, "PATCH", f"{STS}/sub/status", both, content_type=merge)
    assert status_only["spec"]["replicas"] == 0
    assert status_only["status"]["replicas"] == 3
    assert status_only["metadata"]["generation"] == generation
    _, spec_change = call(api, "PATCH", f"{STS}/sub", {"spec": {"replicas": 1}}, content_type=merge)
    assert spec_change["metadata"]["generation"] == generation + 1


def test_scale_subresource_reads_and_writes_replicas(api: EmulatedCluster) -> None:
    call(api, "POST", STS, statefulset("sc", replicas=1))
    status, scale = call(api, "GET", f"{STS}/sc/scale")
    assert (status, scale["kind"], scale["spec"]["replicas"]) == (200, "Scale", 1)
    assert scale["status"]["selector"] == "app=sc"
    kubectl(api.kubeconfig, "scale", "statefulset/sc", "--replicas=3")
    _, obj = call(api, "GET", f"{STS}/sc")
    assert obj["spec"]["replicas"] == 3


def test_label_and_field_selectors_filter_lists(api: EmulatedCluster) -> None:
    for name, tier in (("s1", "a"), ("s2", "b"), ("s3", "a")):
        call(api, "POST", CM, {"metadata": {"name": name, "labels": {"tier": tier}}})
    _, listed = call(api, "GET", f"{CM}?labelSelector=tier%3Da")
    assert [o["metadata"]["name"] for o in listed["items"]] == ["s1", "s3"]
    _, listed = call(api, "GET", f"{CM}?labelSelector=tier%20in%20(a,b),tier!%3Db")
    assert [o["metadata"]["name"] for o in listed["items"]] == ["s1", "s3"]
    _, listed = call(api, "GET", f"{CM}?fieldSelector=metadata.name%3Ds2")
    assert [o["metadata"]["name"] for o in listed["items"]] == ["s2"]


def test_deleting_an_owner_collects_its_dependents_unless_orphaned(api: EmulatedCluster) -> None:
    _, owner = call(api, "POST", CM, {"metadata": {"name": "owner"}})
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner["metadata"]["uid"]}
    call(api, "POST", CM, {"metadata": {"name": "child", "ownerReferences": [ref]}})
    call(api, "POST", STS, statefulset("grandchild", replicas=0, ownerReferences=[ref]))
    call(api, "DELETE", f"{CM}/owner")
    assert call(api, "GET", f"{CM}/child")[0] == 404
    assert call(api, "GET", f"{STS}/grandchild")[0] == 404

    _, owner = call(api, "POST", CM, {"metadata": {"name": "owner2"}})
    ref["uid"], ref["name"] = owner["metadata"]["uid"], "owner2"
    call(api, "POST", CM, {"metadata": {"name": "orphan", "ownerReferences": [ref]}})
    call(api, "DELETE", f"{CM}/owner2", {"propagationPolicy": "Orphan"})
    status, orphan = call(api, "GET", f"{CM}/orphan")
    assert status == 200
    assert "ownerReferences" not in orphan["metadata"]


def test_an_object_created_for_a_gone_owner_is_collected(api: EmulatedCluster) -> None:
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "ghost", "uid": "no-such-uid"}
    call(api, "POST", CM, {"metadata": {"name": "late", "ownerReferences": [ref]}})
    wait_for(lambda: call(api, "GET", f"{CM}/late")[0] == 404)


def test_finalizers_hold_deletion_until_removed(api: EmulatedCluster) -> None:
    call(api, "POST", CM, {"metadata": {"name": "fin", "finalizers": ["x/y"]}})
    _, marked = call(api, "DELETE", f"{CM}/fin")
    assert marked["metadata"]["deletionTimestamp"]
    assert call(api, "GET", f"{CM}/fin")[0] == 200
    call(
        api,
        "PATCH",
        f"{CM}/fin",
        {"metadata": {"finalizers": None}},
        content_type="application/merge-patch+json",
    )
    assert call(api, "GET", f"{CM}/fin")[0] == 404


def read_watch(api: EmulatedCluster, query: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{api.url}{CM}?watch=true&{query}", timeout=30) as stream:
        return [json.loads(line) for line in stream.read().splitlines() if line.strip()]


def test_a_watch_resumes_from_a_resource_version_and_ends_after_its_timeout(api: EmulatedCluster) -> None:
    _, obj = call(api, "POST", CM, {"metadata": {"name": "w"}})
    since = obj["metadata"]["resourceVersion"]
    merge = "application/merge-patch+json"
    call(api, "PATCH", f"{CM}/w", {"data": {"n": "1"}}, content_type=merge)
    call(api, "PATCH", f"{CM}/w", {"data": {"n": "2"}}, content_type=merge)
    events = read_watch(api, f"resourceVersion={since}&timeoutSeconds=1&fieldSelector=metadata.name%3Dw")
    assert [(e["type"], e["object"]["data"]["n"]) for e in events] == [("MODIFIED", "1"), ("MODIFIED", "2")]


def test_a_watch_without_a_version_starts_with_the_current_objects(api: EmulatedCluster) -> None:
    call(api, "POST", CM, {"metadata": {"name": "w2", "labels": {"watch": "me"}}})
    events = read_watch(api, "timeoutSeconds=1&labelSelector=watch%3Dme")
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "w2")]


def test_a_watch_from_a_compacted_version_gets_410_gone(api: EmulatedCluster) -> None:
    store = api.emulator.store  # type: ignore[union-attr]
    cm_type = store.find("", "v1", "configmaps")
    api.call(store.log_floor.__setitem__, (cm_type.group, cm_type.version, cm_type.plural), store.rv)
    events = read_watch(api, "resourceVersion=1&timeoutSeconds=1")
    assert events[0]["type"] == "ERROR"
    assert events[0]["object"]["code"] == 410


def test_custom_resources_get_defaults_and_bad_ones_are_refused_naming_the_field(
    api: EmulatedCluster,
) -> None:
    job = {"apiVersion": "rlkube.io/v1alpha1", "kind": "RLJob", "metadata": {"name": "d"},
           "spec": {"env": {"id": "CartPole-v1"}}}  # fmt: skip
    status, created = call(api, "POST", RLJ, job)
    assert status == 201
    assert created["spec"]["train"]["maxEpochs"] == 100
    assert created["spec"]["policy"]["weightBuffer"]["strategy"] == "Shared"
    bad = json.loads(json.dumps(job))
    bad["metadata"]["name"] = "d2"
    bad["spec"]["train"] = {"maxEpochs": 0}
    status, refused = call(api, "POST", RLJ, bad)
    assert status == 422
    assert "spec.train.maxEpochs" in refused["message"]
    typo = json.loads(json.dumps(job))
    typo["metadata"]["name"] = "d3"
    typo["spec"]["train"] = {"maxEpochz": 3}
    status, refused = call(api, "POST", f"{RLJ}?fieldValidation=Strict", typo)
    assert status == 400
    assert "spec.train.maxEpochz" in refused["message"]
    status, pruned = call(api, "POST", RLJ, typo)  # without Strict the unknown field is dropped
    assert status == 201
    assert "maxEpochz" not in pruned["spec"]["train"]


def test_statefulset_controller_creates_indexed_pods_and_follows_scale(api: EmulatedCluster) -> None:
    call(api, "POST", STS, statefulset("ctl", replicas=2))
    pods = "/api/v1/namespaces/default/pods"

    def names() -> list[str]:
        return sorted(
            p["metadata"]["name"] for p in call(api, "GET", f"{pods}?labelSelector=app%3Dctl")[1]["items"]
        )

    wait_for(lambda: names() == ["ctl-0", "ctl-1"])
    _, pod = call(api, "GET", f"{pods}/ctl-1")
    assert pod["metadata"]["labels"]["apps.kubernetes.io/pod-index"] == "1"
    assert pod["metadata"]["ownerReferences"][0]["kind"] == "StatefulSet"
    wait_for(lambda: call(api, "GET", f"{STS}/ctl")[1].get("status", {}).get("readyReplicas") == 2)
    call(
        api,
        "PATCH",
        f"{STS}/ctl/scale",
        {"spec": {"replicas": 1}},
        content_type="application/merge-patch+json",
    )
    wait_for(lambda: names() == ["ctl-0"])


def test_kubectl_get_prints_the_crd_printer_columns(api: EmulatedCluster) -> None:
    header = kubectl(api.kubeconfig, "get", "rlj").stdout.splitlines()[0].split()
    assert header == ["NAME", "PHASE", "TRAIN", "EVAL", "EPOCH", "PUBLISHED", "LOADED", "RETURN", "AGE"]
    assert "rljobs" in kubectl(api.kubeconfig, "api-resources").stdout


def test_pod_environment_resolves_the_downward_api() -> None:
    pod = {
        "metadata": {"name": "j-train-1", "namespace": "ns", "labels": {"apps.kubernetes.io/pod-index": "1"}},
        "spec": {"nodeName": "node-1"},
    }
    container = {
        "env": [
            {"name": "A", "value": "x"},
            {
                "name": "RANK",
                "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['apps.kubernetes.io/pod-index']"}},
            },
            {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        ]
    }
    assert pod_environment(pod, container) == {"A": "x", "RANK": "1", "NODE": "node-1", "NS": "ns"}


def test_kubeconfig_files_are_written(api: EmulatedCluster) -> None:
    assert Path(api.kubeconfig).read_text().count(api.url) == 1
