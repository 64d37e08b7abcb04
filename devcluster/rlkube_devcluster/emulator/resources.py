"""The resource types the emulator serves: a few built-ins, plus every CRD applied to it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import kmock

VERBS = ("create", "delete", "get", "list", "patch", "update", "watch")


@dataclass(frozen=True)
class ScalePaths:
    spec_replicas: str  # ".spec.replicas"
    status_replicas: str
    label_selector: str | None  # a path to a selector string, or None: derive from spec.selector


@dataclass(frozen=True)
class ResourceType:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    singular: str = ""
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    subresources: frozenset[str] = frozenset()
    scale: ScalePaths | None = None
    schema: dict[str, Any] | None = field(default=None, compare=False, hash=False)
    printer_columns: tuple[dict[str, Any], ...] = field(default=(), compare=False, hash=False)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> kmock.resource:
        return kmock.resource(self.group, self.version, self.plural)

    @property
    def has_status(self) -> bool:
        return "status" in self.subresources

    def discovery(self) -> list[dict[str, Any]]:
        """Entries of an APIResourceList: the resource and its subresources."""
        entries = [
            {
                "name": self.plural,
                "singularName": self.singular or self.kind.lower(),
                "namespaced": self.namespaced,
                "kind": self.kind,
                "verbs": [*VERBS, "deletecollection"],
                **({"shortNames": list(self.short_names)} if self.short_names else {}),
                **({"categories": list(self.categories)} if self.categories else {}),
            }
        ]
        if "status" in self.subresources:
            entries.append(
                {
                    "name": f"{self.plural}/status",
                    "singularName": "",
                    "namespaced": self.namespaced,
                    "kind": self.kind,
                    "verbs": ["get", "patch", "update"],
                }
            )
        if "scale" in self.subresources:
            entries.append(
                {
                    "name": f"{self.plural}/scale",
                    "singularName": "",
                    "namespaced": self.namespaced,
                    "group": "autoscaling",
                    "version": "v1",
                    "kind": "Scale",
                    "verbs": ["get", "patch", "update"],
                }
            )
        return entries


STATEFULSET_SCALE = ScalePaths(".spec.replicas", ".status.replicas", None)

BUILTINS: tuple[ResourceType, ...] = (
    ResourceType(
        "",
        "v1",
        "namespaces",
        "Namespace",
        namespaced=False,
        short_names=("ns",),
        subresources=frozenset({"status"}),
    ),
    ResourceType(
        "",
        "v1",
        "pods",
        "Pod",
        short_names=("po",),
        categories=("all",),
        subresources=frozenset({"status", "log"}),
    ),
    ResourceType(
        "",
        "v1",
        "services",
        "Service",
        short_names=("svc",),
        categories=("all",),
        subresources=frozenset({"status"}),
    ),
    ResourceType("", "v1", "configmaps", "ConfigMap", short_names=("cm",)),
    ResourceType("", "v1", "secrets", "Secret"),
    ResourceType("", "v1", "serviceaccounts", "ServiceAccount", short_names=("sa",)),
    ResourceType("", "v1", "events", "Event", short_names=("ev",)),
    ResourceType(
        "apps",
        "v1",
        "statefulsets",
        "StatefulSet",
        short_names=("sts",),
        categories=("all",),
        subresources=frozenset({"status", "scale"}),
        scale=STATEFULSET_SCALE,
    ),
    ResourceType("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy", short_names=("netpol",)),
    ResourceType(
        "policy",
        "v1",
        "poddisruptionbudgets",
        "PodDisruptionBudget",
        short_names=("pdb",),
        subresources=frozenset({"status"}),
    ),
    ResourceType(
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
        "CustomResourceDefinition",
        namespaced=False,
        short_names=("crd", "crds"),
        subresources=frozenset({"status"}),
    ),
)


def from_crd(crd: dict[str, Any]) -> list[ResourceType]:
    """One ResourceType per served version of a CustomResourceDefinition."""
    spec = crd["spec"]
    names = spec["names"]
    types = []
    for version in spec.get("versions", []):
        if not version.get("served", True):
            continue
        subs = version.get("subresources") or {}
        scale = subs.get("scale")
        types.append(
            ResourceType(
                group=spec["group"],
                version=version["name"],
                plural=names["plural"],
                kind=names["kind"],
                namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                singular=names.get("singular", ""),
                short_names=tuple(names.get("shortNames", ())),
                categories=tuple(names.get("categories", ())),
                subresources=frozenset(subs),
                scale=(
                    ScalePaths(
                        scale["specReplicasPath"], scale["statusReplicasPath"], scale.get("labelSelectorPath")
                    )
                    if scale
                    else None
                ),
                schema=(version.get("schema") or {}).get("openAPIV3Schema"),
                printer_columns=tuple(version.get("additionalPrinterColumns", ())),
            )
        )
    return types
