"""What a pod's container is started with on this machine: directories for its volumes, command, env.

For the cluster-in-a-box (:mod:`rlkube_devcluster.kubelet.node_agent`). Pure, except
:meth:`PodSandbox.create` and :meth:`PodSandbox.remove`, which make and remove directories.

A simulated node is two directories: its disk ``<disk_root>/<node>`` and its memory
``<shm_root>/<node>`` (under /dev/shm). A pod's volumes become:

============================  =========================================================================
volume                        directory
============================  =========================================================================
``emptyDir``                  ``<node disk>/pods/<ns>_<pod>_<uid>/volumes/<volume>`` (``medium: Memory``:
                              the same under the node's memory); kept across container restarts,
                              removed with the pod
``hostPath``                  ``<node memory>/host/<path>`` for a path under /dev/shm, else
                              ``<node disk>/host/<path>``: shared by the node's pods, kept until the
                              kubelet stops
``configMap``                 a pod directory written from the ConfigMap (its ``items``, or every key)
                              each time the container starts
``persistentVolumeClaim``     ``<disk_root>/claims/<ns>/<claim>``: one directory per claim, reachable
                              from every node (as a ReadWriteMany volume)
============================  =========================================================================

The container's env is rewritten as its mounts would make it read: an absolute path under a
``volumeMount``'s ``mountPath`` becomes the same path under the volume's directory (the longest
mount wins, ``subPath`` honoured). A path variable of the env contract (``RLKUBE_SHM_DIR``,
``RLKUBE_RUN_DIR``, ``RLKUBE_JOB_CONFIG``) that no volume covers lives in the container's own
filesystem: a private pod directory (under the node's memory for paths under /dev/shm).

The command is the container's ``command``, or else the image's ENTRYPOINT (``rlkube``; the
image's ``tini --`` is left out: the kubelet starts each container in its own session and signals
the whole group, which is what tini is there for), followed by ``args``. ``rlkube`` is run as
``python -m rlkube.cli`` and ``python``/``python3`` as this interpreter.
"""

from __future__ import annotations

import base64
import shlex
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

#: The image's ENTRYPOINT after ``tini --`` (Dockerfile).
IMAGE_ENTRYPOINT = ("rlkube",)
#: Env-contract variables that name paths inside the container.
CONTRACT_PATH_VARIABLES = ("RLKUBE_SHM_DIR", "RLKUBE_RUN_DIR", "RLKUBE_JOB_CONFIG")
DEV_SHM = PurePosixPath("/dev/shm")


class SandboxError(ValueError):
    """The pod asks for something the cluster-in-a-box cannot give it; the message says what."""


@dataclass(frozen=True)
class Node:
    """One simulated node: a disk directory and a memory directory."""

    name: str
    disk: Path
    memory: Path


def _under(path: PurePosixPath, root: PurePosixPath) -> bool:
    return path == root or root in path.parents


def _host_path(base: Path, path: PurePosixPath) -> Path:
    return base / path.relative_to("/")


@dataclass
class PodSandbox:
    """The directories of one pod on its node, and how its container's view maps onto them."""

    pod: Mapping[str, Any]
    node: Node
    claims_root: Path
    #: volume name -> host directory
    volumes: dict[str, Path] = field(default_factory=dict)
    #: volume name -> ConfigMap name and items (written by :meth:`write_config_maps`)
    config_maps: dict[str, tuple[str, list[dict[str, str]] | None]] = field(default_factory=dict)
    #: volume name -> Secret name and items (written by :meth:`write_secrets`)
    secrets: dict[str, tuple[str, list[dict[str, str]] | None]] = field(default_factory=dict)
    #: volume name -> the sources of a projected volume (written by :meth:`write_projected`)
    projected: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        meta = self.pod["metadata"]
        self.pod_dir_name = f"{meta.get('namespace', '')}_{meta['name']}_{meta.get('uid', '')}"
        for volume in (self.pod.get("spec") or {}).get("volumes") or []:
            self.volumes[volume["name"]] = self._volume_dir(volume)

    @property
    def disk_dir(self) -> Path:
        return self.node.disk / "pods" / self.pod_dir_name

    @property
    def memory_dir(self) -> Path:
        return self.node.memory / "pods" / self.pod_dir_name

    @property
    def rootfs(self) -> Path:
        """The container's own files (the working directory)."""
        return self.disk_dir / "rootfs"

    def _volume_dir(self, volume: Mapping[str, Any]) -> Path:
        name = volume["name"]
        if "emptyDir" in volume:
            memory = (volume["emptyDir"] or {}).get("medium") == "Memory"
            return (self.memory_dir if memory else self.disk_dir) / "volumes" / name
        if "hostPath" in volume:
            path = PurePosixPath(volume["hostPath"]["path"])
            if not path.is_absolute():
                raise SandboxError(f"volume {name}: hostPath {path} is not absolute")
            if _under(path, DEV_SHM):
                return _host_path(self.node.memory / "host", path)
            return _host_path(self.node.disk / "host", path)
        if "configMap" in volume:
            source = volume["configMap"]
            self.config_maps[name] = (source["name"], source.get("items"))
            return self.disk_dir / "volumes" / name
        if "secret" in volume:
            source = volume["secret"]
            self.secrets[name] = (source["secretName"], source.get("items"))
            return self.disk_dir / "volumes" / name
        if "projected" in volume:
            self.projected[name] = list((volume["projected"] or {}).get("sources") or [])
            return self.disk_dir / "volumes" / name
        if "persistentVolumeClaim" in volume:
            namespace = self.pod["metadata"].get("namespace", "")
            return self.claims_root / namespace / volume["persistentVolumeClaim"]["claimName"]
        kinds = sorted(k for k in volume if k != "name")
        raise SandboxError(f"volume {name}: {', '.join(kinds) or 'no source'} is not emulated")

    # Files -----------------------------------------------------------------------------------

    def create(self) -> None:
        self.rootfs.mkdir(parents=True, exist_ok=True)
        for directory in self.volumes.values():
            directory.mkdir(parents=True, exist_ok=True)

    def write_config_maps(self, lookup: Any) -> None:
        """Write each configMap volume; ``lookup(name)`` returns the ConfigMap or None."""
        for volume, (name, items) in self.config_maps.items():
            config_map = lookup(name)
            if config_map is None:
                raise SandboxError(f'configmap "{name}" not found (volume {volume})')
            data = config_map.get("data") or {}
            chosen = items if items is not None else [{"key": k, "path": k} for k in data]
            for item in chosen:
                if item["key"] not in data:
                    raise SandboxError(f'configmap "{name}" has no key {item["key"]!r} (volume {volume})')
                target = self.volumes[volume] / item["path"]
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(data[item["key"]])

    def write_secrets(self, lookup: Any) -> None:
        """Write each secret volume (``data`` is base64, ``stringData`` plain); ``lookup(name)`` -> Secret."""
        for volume, (name, items) in self.secrets.items():
            secret = lookup(name)
            if secret is None:
                raise SandboxError(f'secret "{name}" not found (volume {volume})')
            data = {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}
            data |= {k: str(v).encode() for k, v in (secret.get("stringData") or {}).items()}
            chosen = items if items is not None else [{"key": k, "path": k} for k in data]
            for item in chosen:
                if item["key"] not in data:
                    raise SandboxError(f'secret "{name}" has no key {item["key"]!r} (volume {volume})')
                target = self.volumes[volume] / item["path"]
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data[item["key"]])
                target.chmod(0o440)

    def write_projected(self, *, token: Any, config_map: Any) -> None:
        """Write each projected volume: the ServiceAccount admission plugin's ``kube-api-access-*``
        (a bound token, the cluster's CA, the namespace) and any like it.

        ``token(audience, seconds)`` returns a token for the pod's ServiceAccount (TokenRequest);
        ``config_map(name)`` returns the ConfigMap or None.
        """
        for volume, sources in self.projected.items():
            directory = self.volumes[volume]
            directory.mkdir(parents=True, exist_ok=True)
            for source in sources:
                if "serviceAccountToken" in source:
                    wanted = source["serviceAccountToken"]
                    text = token(wanted.get("audience"), int(wanted.get("expirationSeconds", 3600)))
                    (directory / wanted["path"]).write_text(text)
                elif "configMap" in source:
                    ref = source["configMap"]
                    found = config_map(ref["name"])
                    if found is None:
                        if ref.get("optional"):
                            continue
                        raise SandboxError(f'configmap "{ref["name"]}" not found (volume {volume})')
                    data = found.get("data") or {}
                    for item in ref.get("items") or [{"key": k, "path": k} for k in data]:
                        (directory / item["path"]).write_text(data.get(item["key"], ""))
                elif "downwardAPI" in source:
                    for item in source["downwardAPI"].get("items") or []:
                        field_path = (item.get("fieldRef") or {}).get("fieldPath", "")
                        if field_path != "metadata.namespace":
                            raise SandboxError(f"volume {volume}: downwardAPI {field_path!r} is not emulated")
                        (directory / item["path"]).write_text(self.pod["metadata"].get("namespace", ""))
                else:
                    kinds = sorted(source)
                    raise SandboxError(f"volume {volume}: projected {', '.join(kinds)} is not emulated")

    def remove(self) -> None:
        """Remove what lives and dies with the pod (its emptyDirs and own files)."""
        shutil.rmtree(self.disk_dir, ignore_errors=True)
        shutil.rmtree(self.memory_dir, ignore_errors=True)

    # The container's view --------------------------------------------------------------------

    def mounts(self, container: Mapping[str, Any]) -> list[tuple[PurePosixPath, Path]]:
        """(mountPath, host directory) of the container's mounts, longest mountPath first."""
        out = []
        for mount in container.get("volumeMounts") or []:
            if mount["name"] not in self.volumes:
                raise SandboxError(f"volumeMount {mount['mountPath']}: no volume {mount['name']!r}")
            host = self.volumes[mount["name"]]
            if mount.get("subPath"):
                host = host / mount["subPath"]
            out.append((PurePosixPath(mount["mountPath"]), host))
        return sorted(out, key=lambda m: len(m[0].parts), reverse=True)

    def host_path(self, container: Mapping[str, Any], path: str) -> Path | None:
        """Where ``path`` (inside the container) is on this machine; None if no mount covers it."""
        inside = PurePosixPath(path)
        for mount_path, host in self.mounts(container):
            if _under(inside, mount_path):
                return host / inside.relative_to(mount_path)
        return None

    def projected_mounts(self, container: Mapping[str, Any]) -> list[tuple[PurePosixPath, Path]]:
        """(mountPath, host directory) of the container's projected volumes (its ServiceAccount token)."""
        wanted = {m["mountPath"] for m in container.get("volumeMounts") or [] if m["name"] in self.projected}
        return [(inside, host) for inside, host in self.mounts(container) if str(inside) in wanted]

    def rewrite_paths(self, container: Mapping[str, Any], env: Mapping[str, str]) -> dict[str, str]:
        out = dict(env)
        for name, value in env.items():
            if not value.startswith("/"):
                continue
            host = self.host_path(container, value)
            if host is None and name in CONTRACT_PATH_VARIABLES:
                inside = PurePosixPath(value)
                base = self.memory_dir / "rootfs" if _under(inside, DEV_SHM) else self.rootfs
                host = _host_path(base, inside)
            if host is not None:
                out[name] = str(host)
        return out

    def contract_dirs(self, env: Mapping[str, str]) -> list[Path]:
        """Directories the rewritten contract paths need (the image creates them; here we do)."""
        dirs = []
        for name in ("RLKUBE_SHM_DIR", "RLKUBE_RUN_DIR"):
            if env.get(name, "").startswith("/"):
                dirs.append(Path(env[name]))
        return dirs


def in_mount_namespace(command: list[str], binds: list[tuple[PurePosixPath, Path]]) -> list[str]:
    """``command`` in a mount namespace of its own where each host directory is at its mountPath.

    Libraries that read the ServiceAccount token at the one path Kubernetes mounts it at (the
    kubernetes client's in-cluster config) find it there. Needs root (``unshare``); the mount
    points are created on the host's filesystem, empty, the first time.
    """
    steps = [
        f"mkdir -p {shlex.quote(str(inside))} && mount --bind {shlex.quote(str(host))} "
        f"{shlex.quote(str(inside))}"
        for inside, host in binds
    ]
    script = " && ".join([*steps, 'exec "$@"'])
    return ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", script, "sh", *command]


def container_command(container: Mapping[str, Any], *, python: str = sys.executable) -> list[str]:
    """The argv of the container's process on this machine."""
    command = list(container.get("command") or IMAGE_ENTRYPOINT) + [
        str(a) for a in container.get("args") or []
    ]
    if command[0] == "rlkube":
        return [python, "-m", "rlkube.cli", *command[1:]]
    if command[0] in ("python", "python3"):
        return [python, *command[1:]]
    return command
