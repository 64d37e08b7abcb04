"""Every permission the operator uses, in one place.

Pure data. ``scripts/generate.py`` writes the Helm chart's rules
(charts/rlkube/templates/_rbac_rules.tpl) from these tuples. The tests run the operator against a
real API server under a ClusterRole of exactly these rules and read its audit log, so a verb the
operator starts using is a test failure until it is listed here, and nothing more is granted. A
rule with ``only_with`` is needed only when that operator setting is on (the chart grants it only
then).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Rule:
    api_groups: tuple[str, ...]
    resources: tuple[str, ...]
    verbs: tuple[str, ...]
    why: str
    only_with: str = ""  # an operator setting (env name) without which the rule is not needed

    def as_manifest(self) -> dict[str, list[str]]:
        return {
            "apiGroups": list(self.api_groups),
            "resources": list(self.resources),
            "verbs": list(self.verbs),
        }


#: Rules that hold in the namespaces the operator watches (a Role per namespace, or the ClusterRole).
NAMESPACED_RULES: tuple[Rule, ...] = (
    Rule(
        ("rlkube.io",),
        ("rljobs",),
        ("list", "watch", "patch", "delete"),
        "kopf watches jobs and patches its annotations; the TTL deletes finished jobs",
    ),
    Rule(("rlkube.io",), ("rljobs/status",), ("patch",), "write status and conditions"),
    Rule(
        ("apps",),
        ("statefulsets",),
        ("get", "list", "watch", "create", "patch"),
        "train and eval StatefulSets: read status, watch for deletion or drift, server-side apply",
    ),
    Rule(
        ("",),
        ("services", "configmaps"),
        ("list", "watch", "create", "patch"),
        "the job's Services and ConfigMap: watch for deletion or drift, server-side apply",
    ),
    Rule(
        ("",),
        ("secrets",),
        ("get", "create", "patch"),
        "each job's credential Secret: read its token (GetStatus), create it once when missing",
    ),
    Rule(
        ("networking.k8s.io",),
        ("networkpolicies",),
        ("create", "patch"),
        "the per-job NetworkPolicy when RLKUBE_NETWORK_POLICY is on (server-side apply)",
        only_with="RLKUBE_NETWORK_POLICY",
    ),
    Rule(
        ("policy",),
        ("poddisruptionbudgets",),
        ("create", "patch"),
        "the train ranks' PodDisruptionBudget (server-side apply)",
    ),
    Rule(
        ("scheduling.volcano.sh", "scheduling.x-k8s.io"),
        ("podgroups",),
        ("create", "patch"),
        "the train gang's PodGroup for spec.scheduling.gang volcano or coscheduling (server-side apply); "
        "granted even where those CRDs are not installed, which grants nothing",
    ),
    Rule(
        ("",),
        ("pods",),
        ("list", "watch"),
        "restarts and termination messages from pod status; a pod change refreshes its job",
    ),
    Rule(
        ("",), ("events",), ("create",), "events for every transition and error (kopf posts core/v1 events)"
    ),
    Rule(
        ("kueue.x-k8s.io",),
        ("workloads",),
        ("get", "list", "watch", "create", "patch", "delete"),
        "kueueIntegration RLJob: each job's Kueue Workload and eval slice (server-side apply), watched "
        "for admission and eviction; a resized or unneeded eval slice is deleted; granted even where "
        "Kueue is not installed, which grants nothing",
    ),
    Rule(
        ("kueue.x-k8s.io",),
        ("workloads/status",),
        ("patch",),
        "kueueIntegration RLJob: mark a Workload Finished, release its quota after an eviction",
    ),
)

#: Rules that are always cluster-scoped (kopf discovers resources and namespaces).
CLUSTER_RULES: tuple[Rule, ...] = (
    Rule(
        ("apiextensions.k8s.io",),
        ("customresourcedefinitions",),
        ("list", "watch"),
        "kopf scans CRDs to find rljobs",
    ),
    Rule(
        ("",),
        ("namespaces",),
        ("list", "watch"),
        "kopf follows namespaces when RLKUBE_WATCH_NAMESPACES holds glob patterns",
    ),
    Rule(
        ("kueue.x-k8s.io",),
        ("resourceflavors",),
        ("get",),
        "kueueIntegration RLJob: the admitted flavours' node labels and tolerations for the pods",
    ),
    Rule(
        ("scheduling.k8s.io",),
        ("priorityclasses",),
        ("get",),
        "kueueIntegration RLJob: the value of trainer.priorityClassName for the Workload's priority",
    ),
)

#: Rules in the operator's own namespace only (a Role there, whatever namespaces it watches).
LEASE_RULES: tuple[Rule, ...] = (
    Rule(
        ("coordination.k8s.io",),
        ("leases",),
        ("get", "create", "update"),
        "leader election among operator replicas: read, create, renew and release the Lease",
    ),
)

RULES: tuple[Rule, ...] = NAMESPACED_RULES + CLUSTER_RULES + LEASE_RULES


def always(rules: tuple[Rule, ...]) -> tuple[Rule, ...]:
    """The rules needed whatever the operator's settings."""
    return tuple(rule for rule in rules if not rule.only_with)
