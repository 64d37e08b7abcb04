"""Every permission the operator uses, in one place.

Pure data. The Helm chart's ClusterRole/Role is tested against :data:`RULES`, so a verb the
operator starts using is a test failure until it is listed here (and nothing more is granted).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Rule:
    api_groups: tuple[str, ...]
    resources: tuple[str, ...]
    verbs: tuple[str, ...]
    why: str

    def as_manifest(self) -> dict[str, list[str]]:
        return {
            "apiGroups": list(self.api_groups),
            "resources": list(self.resources),
            "verbs": list(self.verbs),
        }


#: Rules that hold in the namespaces the operator watches (a Role per namespace, or the ClusterRole).
NAMESPACED_RULES: tuple[Rule, ...] = (
    Rule(("rlkube.io",), ("rljobs",), ("get", "list", "watch", "patch", "delete"), "reconcile; TTL deletes"),
    Rule(("rlkube.io",), ("rljobs/status",), ("get", "patch"), "write status and conditions"),
    Rule(
        ("apps",),
        ("statefulsets",),
        ("get", "list", "watch", "create", "patch", "delete"),
        "train and eval StatefulSets (server-side apply)",
    ),
    Rule(
        ("",),
        ("services", "configmaps"),
        ("get", "list", "watch", "create", "patch", "delete"),
        "Services and the job's ConfigMap (server-side apply)",
    ),
    Rule(("",), ("pods",), ("get", "list", "watch"), "count train restarts and ready pods"),
    Rule(("",), ("events",), ("create", "patch"), "kopf posts events for transitions and errors"),
    Rule(("events.k8s.io",), ("events",), ("create", "patch"), "kopf posts events (events.k8s.io)"),
)

#: Rules that are always cluster-scoped (kopf discovers resources and namespaces).
CLUSTER_RULES: tuple[Rule, ...] = (
    Rule(
        ("apiextensions.k8s.io",),
        ("customresourcedefinitions",),
        ("get", "list", "watch"),
        "kopf scans CRDs to find rljobs",
    ),
    Rule(("",), ("namespaces",), ("get", "list", "watch"), "kopf follows namespaces it serves"),
)

RULES: tuple[Rule, ...] = NAMESPACED_RULES + CLUSTER_RULES
