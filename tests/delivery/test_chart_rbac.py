"""The chart grants the operator exactly the permissions in rlkube_operator/rbac.py, in either mode.

Permissions are computed the way the API server does: from the bindings whose subject is the
operator's ServiceAccount, to the rules of the roles they reference, as (scope, group, resource,
verb) grants. A rule the operator starts using without the chart granting it, or a grant the
chart adds without the operator listing it, fails here.
"""

from __future__ import annotations

from typing import Any

from rlkube_operator.rbac import CLUSTER_RULES, LEASE_RULES, NAMESPACED_RULES, Rule, always

from tests.delivery.chart import DEFAULT, EVERYTHING, NAMESPACE, NAMESPACED, ValueSet, find, only, render

CLUSTER = "*cluster*"
Grant = tuple[str, str, str, str]  # scope (a namespace or CLUSTER), API group, resource, verb


def grants(rules: tuple[Rule, ...], scope: str) -> set[Grant]:
    return {
        (scope, group, resource, verb)
        for rule in rules
        for group in rule.api_groups
        for resource in rule.resources
        for verb in rule.verbs
    }


#: Every rule the operator watches with, wherever it watches (the ClusterRole in cluster-wide mode).
WATCHING = NAMESPACED_RULES + CLUSTER_RULES
#: The leader election Lease: a Role in the operator's own namespace, in either mode.
LEASE = grants(LEASE_RULES, NAMESPACE)


def operator_service_account(objects: tuple[dict[str, Any], ...]) -> dict[str, str]:
    account = only(objects, "ServiceAccount")
    return {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": NAMESPACE}


def manifest_grants(rules: list[dict[str, Any]], scope: str) -> set[Grant]:
    out: set[Grant] = set()
    for rule in rules:
        assert set(rule) == {"apiGroups", "resources", "verbs"}, f"unexpected rule fields: {rule}"
        assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"], f"wildcard in {rule}"
        out |= {(scope, g, r, v) for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    return out


def operator_grants(objects: tuple[dict[str, Any], ...]) -> set[Grant]:
    subject = operator_service_account(objects)
    out: set[Grant] = set()
    for binding in find(objects, "ClusterRoleBinding") + find(objects, "RoleBinding"):
        if subject not in binding["subjects"]:
            continue
        ref = binding["roleRef"]
        if binding["kind"] == "ClusterRoleBinding":
            (role,) = find(objects, "ClusterRole", ref["name"])
            out |= manifest_grants(role["rules"], CLUSTER)
        else:
            namespace = binding["metadata"]["namespace"]
            assert ref["kind"] == "Role", "the chart binds namespaced grants through Roles"
            (role,) = [
                r for r in find(objects, "Role", ref["name"]) if r["metadata"]["namespace"] == namespace
            ]
            out |= manifest_grants(role["rules"], namespace)
    return out


def test_cluster_wide_mode_grants_exactly_the_operators_rules() -> None:
    # NetworkPolicies are on by default, so their grant is too.
    assert operator_grants(render(DEFAULT)) == grants(WATCHING, CLUSTER) | LEASE


def test_namespaced_mode_grants_namespaced_rules_per_namespace_and_the_rest_cluster_wide() -> None:
    expected = (
        grants(always(CLUSTER_RULES), CLUSTER)
        | grants(NAMESPACED_RULES, "team-a")
        | grants(NAMESPACED_RULES, "team-b")
        | LEASE
    )
    assert operator_grants(render(NAMESPACED)) == expected


def test_network_policy_switch_adds_only_the_networkpolicy_grant() -> None:
    off = ValueSet("no-netpol", sets=("networkPolicy.enabled=false",))
    assert operator_grants(render(off)) == grants(always(WATCHING), CLUSTER) | LEASE
    assert operator_grants(render(DEFAULT)) == grants(WATCHING, CLUSTER) | LEASE
    assert grants(WATCHING, CLUSTER) - grants(always(WATCHING), CLUSTER) == {
        (CLUSTER, "networking.k8s.io", "networkpolicies", verb) for verb in ("create", "patch")
    }
    everything = grants(CLUSTER_RULES, CLUSTER) | grants(NAMESPACED_RULES, "team-a") | LEASE
    assert operator_grants(render(EVERYTHING)) == everything


def test_user_roles_for_rljobs_are_aggregated_and_not_bound_to_the_operator() -> None:
    objects = render(DEFAULT)
    bound = {b["roleRef"]["name"] for b in find(objects, "ClusterRoleBinding")}
    aggregated = [
        role
        for role in find(objects, "ClusterRole")
        if any(
            key.startswith("rbac.authorization.k8s.io/aggregate-to-") for key in role["metadata"]["labels"]
        )
    ]
    assert {r["metadata"]["name"] for r in aggregated} == {
        "rlkube-system-rlkube-operator-edit",
        "rlkube-system-rlkube-operator-view",
    }
    assert not bound & {r["metadata"]["name"] for r in aggregated}
    edit = next(r for r in aggregated if r["metadata"]["name"].endswith("-edit"))
    assert (CLUSTER, "rlkube.io", "rljobs/scale", "update") in manifest_grants(edit["rules"], CLUSTER)
    off = ValueSet("no-aggregate", sets=("rbac.aggregateToDefaultRoles=false",))
    assert len(find(render(off), "ClusterRole")) == 1


def test_no_rbac_objects_when_rbac_create_is_false() -> None:
    objects = render(ValueSet("no-rbac", sets=("rbac.create=false",)))
    kinds = {o["kind"] for o in objects}
    assert not kinds & {"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}


def test_an_existing_service_account_can_be_used() -> None:
    objects = render(
        ValueSet("own-sa", sets=("serviceAccount.create=false", "serviceAccount.name=platform-sa"))
    )
    assert not find(objects, "ServiceAccount")
    deployment = only(objects, "Deployment")
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "platform-sa"
    (binding,) = [b for b in find(objects, "ClusterRoleBinding")]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "platform-sa", "namespace": NAMESPACE}]
