"""The Pod Security Standards' checks that apply to the pods rlkube renders (a test helper).

Written from https://kubernetes.io/docs/concepts/security/pod-security-standards/ (Kubernetes
1.29..1.35): each check returns the violations of one control, named by profile, so tests can say
which profile a pod meets and exactly why not. Controls that rlkube's pods can never touch
(AppArmor, SELinux, /proc mount, sysctls, Windows) are left out.
"""

from __future__ import annotations

from typing import Any

RESTRICTED_VOLUME_TYPES = frozenset(
    {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
)
BASELINE_CAPABILITIES = frozenset(
    {
        "AUDIT_WRITE",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "MKNOD",
        "NET_BIND_SERVICE",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_CHROOT",
    }
)


def _containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [*pod.get("initContainers", []), *pod["containers"]]


def baseline_violations(pod: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(key):
            out.append(f"baseline: {key}")
    out += [f"baseline: hostPath volume {v['name']}" for v in pod.get("volumes", []) if "hostPath" in v]
    for container in _containers(pod):
        context = container.get("securityContext", {})
        name = container["name"]
        if context.get("privileged"):
            out.append(f"baseline: {name} privileged")
        added = set(context.get("capabilities", {}).get("add", []))
        if added - BASELINE_CAPABILITIES:
            out.append(f"baseline: {name} adds {sorted(added - BASELINE_CAPABILITIES)}")
        if any(p.get("hostPort") for p in container.get("ports", [])):
            out.append(f"baseline: {name} hostPort")
    return out


def restricted_violations(pod: dict[str, Any]) -> list[str]:
    out = baseline_violations(pod)
    for volume in pod.get("volumes", []):
        kind = next(k for k in volume if k != "name")
        if kind not in RESTRICTED_VOLUME_TYPES:
            out.append(f"restricted: volume type {kind}")
    pod_context = pod.get("securityContext", {})
    pod_seccomp = pod_context.get("seccompProfile", {}).get("type")
    for container in _containers(pod):
        context = container.get("securityContext", {})
        name = container["name"]
        if context.get("allowPrivilegeEscalation") is not False:
            out.append(f"restricted: {name} allowPrivilegeEscalation is not false")
        non_root = context.get("runAsNonRoot", pod_context.get("runAsNonRoot"))
        if non_root is not True:
            out.append(f"restricted: {name} runAsNonRoot is not true")
        if context.get("runAsUser", pod_context.get("runAsUser")) == 0:
            out.append(f"restricted: {name} runAsUser 0")
        if context.get("seccompProfile", {}).get("type", pod_seccomp) not in ("RuntimeDefault", "Localhost"):
            out.append(f"restricted: {name} seccompProfile")
        capabilities = context.get("capabilities", {})
        if "ALL" not in capabilities.get("drop", []):
            out.append(f"restricted: {name} does not drop ALL capabilities")
        if set(capabilities.get("add", [])) - {"NET_BIND_SERVICE"}:
            out.append(f"restricted: {name} adds {sorted(set(capabilities['add']) - {'NET_BIND_SERVICE'})}")
    return out
