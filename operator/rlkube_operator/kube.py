"""The few Kubernetes API calls the operator makes, on plain dicts (I/O).

Blocking (the official ``kubernetes`` client); the handlers call it through a thread pool.
Every call here has a matching rule in :mod:`rlkube_operator.rbac`:

* ``apply``   PATCH application/apply-patch+yaml (server-side apply, forced, one field manager)
* ``get``     GET one object (StatefulSets, to read their status and spec hash)
* ``list``    GET a collection with a label selector (the train pods, for restart counts)
* ``delete``  DELETE (an RLJob whose ttlSecondsAfterFinished ran out; its children go by GC)
* ``patch_status``  PATCH application/merge-patch+json on ``rljobs/status`` (the status refresher)
* ``post_event``    POST a core/v1 Event about a job (the refresher and the child watches)
* ``create`` / ``replace``  POST / PUT (the leader-election Lease: a PUT names the
  resourceVersion it read, so of two replicas writing the same version one gets 409)

kopf itself lists and watches RLJobs, the job's StatefulSets, Services, ConfigMaps and pods.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubernetes import client, config

#: kind -> (plural, namespaced) for the kinds the operator touches.
PLURALS: dict[str, str] = {
    "ConfigMap": "configmaps",
    "Service": "services",
    "StatefulSet": "statefulsets",
    "Pod": "pods",
    "NetworkPolicy": "networkpolicies",
    "Secret": "secrets",
    "PodDisruptionBudget": "poddisruptionbudgets",
    "PodGroup": "podgroups",  # scheduling.volcano.sh and scheduling.x-k8s.io alike
    "RLJob": "rljobs",
    "Event": "events",
    # Kueue's, for spec.scheduling.kueueIntegration RLJob (rlkube_operator.kueue_gate)
    "Workload": "workloads",
    "ResourceFlavor": "resourceflavors",
    "PriorityClass": "priorityclasses",
    "Lease": "leases",
}

#: ``source.component`` of the events the operator posts itself.
EVENT_COMPONENT = "rlkube-operator"


class ApiError(Exception):
    """A non-2xx answer; ``status`` is the HTTP code, the message is the API server's."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason

    @property
    def retryable(self) -> bool:
        return self.status in (409, 429) or self.status >= 500


def object_path(api_version: str, kind: str, namespace: str, name: str | None = None) -> str:
    """The object's (or the collection's) path; ``namespace`` "" for a cluster-scoped kind."""
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    path = f"{base}/namespaces/{namespace}/{PLURALS[kind]}" if namespace else f"{base}/{PLURALS[kind]}"
    return f"{path}/{name}" if name else path


@dataclass
class Kube:
    """One authenticated client (in-cluster service account, else the current kubeconfig)."""

    api: client.ApiClient
    field_manager: str
    timeout: float

    @classmethod
    def connect(cls, *, field_manager: str, timeout: float) -> Kube:
        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
        return cls(api=client.ApiClient(), field_manager=field_manager, timeout=timeout)

    def close(self) -> None:
        self.api.close()

    def _call(
        self,
        method: str,
        path: str,
        *,
        query: list[tuple[str, str]] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> Any:
        serialized = self.api.param_serialize(
            method,
            path,
            query_params=query or [],
            header_params={"Content-Type": content_type, "Accept": "application/json"},
            body=body,
            auth_settings=["BearerToken"],
        )
        response = self.api.call_api(*serialized, _request_timeout=self.timeout)
        response.read()
        text = response.data.decode("utf-8") if response.data else ""
        if not 200 <= response.status < 300:
            try:
                payload = json.loads(text)
                reason, message = payload.get("reason", ""), payload.get("message", text)
            except ValueError:
                reason, message = "", text
            raise ApiError(response.status, reason or str(response.reason), message)
        return json.loads(text) if text else None

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        path = object_path(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])
        query = [("fieldManager", self.field_manager), ("force", "true")]
        return self._call("PATCH", path, query=query, body=obj, content_type="application/apply-patch+yaml")

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self._call("GET", object_path(api_version, kind, namespace, name))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        """POST; ApiError 409 when an object of that name exists."""
        meta = obj["metadata"]
        return self._call(
            "POST", object_path(obj["apiVersion"], obj["kind"], meta.get("namespace", "")), body=obj
        )

    def replace(self, obj: dict[str, Any]) -> dict[str, Any]:
        """PUT; with ``metadata.resourceVersion`` set, ApiError 409 when the object changed since."""
        meta = obj["metadata"]
        path = object_path(obj["apiVersion"], obj["kind"], meta.get("namespace", ""), meta["name"])
        return self._call("PUT", path, body=obj)

    def list(
        self, api_version: str, kind: str, namespace: str, *, label_selector: str
    ) -> list[dict[str, Any]]:
        answer = self._call(
            "GET", object_path(api_version, kind, namespace), query=[("labelSelector", label_selector)]
        )
        return list(answer.get("items", []))

    def delete(self, api_version: str, kind: str, namespace: str, name: str) -> bool:
        """Delete with background propagation; False when it was already gone."""
        try:
            self._call(
                "DELETE",
                object_path(api_version, kind, namespace, name),
                body={"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"},
            )
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def patch_status(
        self,
        api_version: str,
        kind: str,
        namespace: str,
        name: str,
        patch: Mapping[str, Any],
        *,
        resource_version: str | None = None,
    ) -> dict[str, Any]:
        """Merge-patch the status subresource; the answer is the object as stored.

        ``resource_version``: only if the object is still that version (else ApiError 409)."""
        path = object_path(api_version, kind, namespace, name) + "/status"
        body: dict[str, Any] = {"status": dict(patch)}
        if resource_version is not None:
            body["metadata"] = {"resourceVersion": resource_version}
        return self._call("PATCH", path, body=body, content_type="application/merge-patch+json")

    def post_event(
        self,
        involved: Mapping[str, Any],
        *,
        type: str,
        reason: str,
        message: str,
        now: datetime | None = None,
    ) -> None:
        """A core/v1 Event about ``involved`` (an object body), as ``kubectl describe`` shows it."""
        meta = involved.get("metadata") or {}
        stamp = (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta.get('name', 'rljob')}.", "namespace": meta.get("namespace")},
            "involvedObject": {
                "apiVersion": involved.get("apiVersion"),
                "kind": involved.get("kind"),
                "name": meta.get("name"),
                "namespace": meta.get("namespace"),
                "uid": meta.get("uid"),
            },
            "type": type,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": EVENT_COMPONENT},
            "reportingComponent": EVENT_COMPONENT,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        self._call("POST", object_path("v1", "Event", str(meta.get("namespace"))), body=event)
