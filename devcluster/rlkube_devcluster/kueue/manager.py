"""Kueue's manager beside the real control plane, as a local process.

    with KueueManager(plane, workdir).start() as kueue:
        kueue.log          # the manager's log

What an in-cluster install (its Deployment, Service and cert-manager or internal certificates) does,
done here for a process on loopback:

* its 11 CRDs (from the module, :func:`.build.crd_files`) created and Established;
* a Configuration (``internalCertManagement`` off, the webhook server on 127.0.0.1, no leader
  election, health and metrics on free loopback ports, the integrations :data:`FRAMEWORKS` and
  :data:`EXTERNAL_FRAMEWORKS`) and ``--feature-gates=VisibilityOnDemand=false`` (no aggregated API);
* the webhook server's certificate, issued for 127.0.0.1 by the control plane's CA;
* the metrics certificate, which Kueue always reads from /etc/kueue/metrics/certs: the manager runs
  in a private mount namespace (``unshare -m``) where an overlay on /etc adds that directory, so the
  machine's /etc is never touched (this needs root);
* its admission webhooks (they fail closed, so they are registered only once the manager answers
  ``/readyz``), from the module's manifests with ``clientConfig.url`` and ``caBundle`` in place of
  the in-cluster Service.

The manager acts as cluster-admin (a client certificate in ``system:masters``), in place of the
ServiceAccount and ClusterRole an install gives it. :meth:`stop` removes the webhook
configurations before it stops the process, so the API server never calls a webhook that is gone.
"""

from __future__ import annotations

import atexit
import base64
import os
import shutil
import signal
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml
from rlkube.launch.processes import LOOPBACK, free_port, signal_group, spawn, tail

from rlkube_devcluster.controlplane.cluster import ControlPlane
from rlkube_devcluster.kubelet.api_client import ApiError, KubeApi
from rlkube_devcluster.kueue.build import KUEUE_VERSION, crd_files, ensure_kueue, webhook_manifests
from rlkube_devcluster.waiting import WaitingCannotHelp, wait_for

#: Kueue's own namespace (events, and the namespace its pod integration never manages).
NAMESPACE = "kueue-system"
#: Built-in integrations the dev cluster enables: the train StatefulSet or pod group routes of
#: ``spec.scheduling.kueueIntegration`` (``statefulset`` needs ``pod``).
FRAMEWORKS = ("pod", "statefulset")
#: Kinds whose Workloads another controller creates: the RLJob, through the rlkube operator.
EXTERNAL_FRAMEWORKS = ("RLJob.v1alpha1.rlkube.io",)
#: The manager's feature gates: the visibility API would need an APIService and its own serving.
FEATURE_GATES = "VisibilityOnDemand=false"
#: Where Kueue reads its metrics certificate, whatever its configuration says.
METRICS_CERT_DIR = Path("/etc/kueue/metrics/certs")
START_TIMEOUT = 120.0
_STOP_GRACE = 15.0
_CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
_WEBHOOK_KINDS = {
    "MutatingWebhookConfiguration": "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
    "ValidatingWebhookConfiguration": "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
}


class KueueError(RuntimeError):
    """Kueue could not be started (its log's tail is in the message)."""


class _Exited(KueueError, WaitingCannotHelp):
    """The manager exited while it was awaited."""


class KueueManager:
    def __init__(self, plane: ControlPlane, workdir: Path, *, binary: Path | None = None) -> None:
        self.plane = plane
        self.workdir = workdir
        self.binary = binary
        self.log = workdir / "logs" / "kueue.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.api: KubeApi | None = None
        self.webhooks: list[str] = []  # API paths of the webhook configurations registered

    @staticmethod
    def unavailable_reason() -> str | None:
        """Why Kueue cannot run on this machine (None when it can)."""
        if os.geteuid() != 0:
            return (
                "Kueue reads its metrics certificate from /etc/kueue/metrics/certs: running it in a "
                "mount namespace of its own needs root"
            )
        if shutil.which("unshare") is None or shutil.which("mount") is None:
            return "running Kueue beside the control plane needs `unshare` and `mount` (util-linux)"
        return None

    def start(self) -> KueueManager:
        reason = self.unavailable_reason()
        if reason is not None:
            raise KueueError(reason)
        binary = self.binary or ensure_kueue()
        atexit.register(self.stop)
        try:
            self._start(binary)
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self, binary: Path) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.api = KubeApi(self.plane.kubeconfig)
        self._install_crds()
        self._ensure_namespace()
        ca = self.plane.ca
        serving = ca.serving("kueue-webhook", ips=[LOOPBACK], dns=["localhost"])
        webhook_certs = self.workdir / "webhook-certs"
        webhook_certs.mkdir(exist_ok=True)
        shutil.copy(serving.cert, webhook_certs / "tls.crt")
        shutil.copy(serving.key, webhook_certs / "tls.key")
        # The overlay's upper layer holds what the manager sees under /etc (its metrics certificate).
        upper = self.workdir / "etc-overlay" / "upper"
        metrics_certs = upper / METRICS_CERT_DIR.relative_to("/etc")
        metrics_certs.mkdir(parents=True, exist_ok=True)
        (self.workdir / "etc-overlay" / "work").mkdir(exist_ok=True)
        metrics = ca.serving("kueue-metrics", ips=[LOOPBACK], dns=["localhost"])
        shutil.copy(metrics.cert, metrics_certs / "tls.crt")
        shutil.copy(metrics.key, metrics_certs / "tls.key")

        self.webhook_port, self.health_port, self.metrics_port = free_port(), free_port(), free_port()
        config = self.workdir / "config.yaml"
        config.write_text(yaml.safe_dump(self._configuration(webhook_certs), sort_keys=False))
        kubeconfig = self.plane.kubeconfig_for("rlkube-kueue", groups=("system:masters",))
        overlay = f"lowerdir=/etc,upperdir={upper},workdir={self.workdir / 'etc-overlay' / 'work'}"
        script = 'mount -t overlay overlay -o "$1" /etc && shift && exec "$@"'
        command = [
            "unshare", "--mount", "--propagation", "private", "sh", "-c", script, "kueue-mounts",
            overlay, str(binary), f"--config={config}", f"--feature-gates={FEATURE_GATES}",
        ]  # fmt: skip
        env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
        try:
            self.process = spawn(command, env, self.log, die_with_us=False)
        except OSError as exc:
            raise KueueError(f"cannot start Kueue ({binary}): {exc}") from exc
        wait_for(
            self._ready,
            timeout=START_TIMEOUT,
            interval=0.2,
            what=f"Kueue to answer /readyz on port {self.health_port} (log: {self.log})",
        )
        self._register_webhooks(ca.cert)
        wait_for(
            self._webhooks_answer,
            timeout=START_TIMEOUT,
            interval=0.5,
            what=f"the API server to reach Kueue's webhooks (log: {self.log})",
        )

    def _client(self) -> KubeApi:
        assert self.api is not None, "Kueue is not started"
        return self.api

    def _configuration(self, webhook_certs: Path) -> dict[str, Any]:
        return {
            "apiVersion": "config.kueue.x-k8s.io/v1beta2",
            "kind": "Configuration",
            "namespace": NAMESPACE,
            "health": {"healthProbeBindAddress": f"{LOOPBACK}:{self.health_port}"},
            "metrics": {"bindAddress": f"{LOOPBACK}:{self.metrics_port}"},
            "webhook": {"port": self.webhook_port, "host": LOOPBACK, "certDir": str(webhook_certs)},
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "clientConnection": {"qps": 50, "burst": 100},
            "integrations": {
                "frameworks": list(FRAMEWORKS),
                "externalFrameworks": list(EXTERNAL_FRAMEWORKS),
            },
        }

    def _ready(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise _Exited(
                f"Kueue {KUEUE_VERSION} exited with {self.process.returncode}; its log ({self.log}) "
                f"ends:\n{tail(self.log, 40)}"
            )
        try:
            url = f"http://{LOOPBACK}:{self.health_port}/readyz"
            with urllib.request.urlopen(url, timeout=5) as answer:
                return bool(answer.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def _install_crds(self) -> None:
        names = []
        for path in crd_files():
            crd = yaml.safe_load(path.read_text())
            names.append(crd["metadata"]["name"])
            try:
                self._client().create(_CRDS, crd)  # too big for kubectl's client-side apply annotation
            except ApiError as exc:
                if exc.status != 409:
                    raise

        def established() -> bool:
            for name in names:
                conditions = (self._client().get(f"{_CRDS}/{name}").get("status") or {}).get("conditions")
                if not any(c["type"] == "Established" and c["status"] == "True" for c in conditions or []):
                    return False
            return True

        wait_for(established, timeout=START_TIMEOUT, what="Kueue's CRDs to be Established")

    def _ensure_namespace(self) -> None:
        try:
            self._client().create("/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
        except ApiError as exc:
            if exc.status != 409:
                raise

    def webhook_configurations(self, ca_cert: Path) -> list[dict[str, Any]]:
        """The module's webhook configurations, pointed at this manager's URL with our CA."""
        bundle = base64.b64encode(ca_cert.read_bytes()).decode()
        out = []
        for document in yaml.safe_load_all(webhook_manifests().read_text()):
            if not document:
                continue
            document["metadata"]["name"] = f"kueue-{document['metadata']['name']}"
            for hook in document.get("webhooks") or []:
                path = hook["clientConfig"]["service"]["path"]
                hook["clientConfig"] = {
                    "url": f"https://{LOOPBACK}:{self.webhook_port}{path}",
                    "caBundle": bundle,
                }
            out.append(document)
        return out

    def _register_webhooks(self, ca_cert: Path) -> None:
        for document in self.webhook_configurations(ca_cert):
            base = _WEBHOOK_KINDS[document["kind"]]
            path = f"{base}/{document['metadata']['name']}"
            try:
                self._client().create(base, document)
            except ApiError as exc:
                if exc.status != 409:
                    raise
                current = self._client().get(path)
                document["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
                self._client().request("PUT", path, document)
            self.webhooks.append(path)

    def _webhooks_answer(self) -> bool:
        """A server-side dry run of a ResourceFlavor passes through Kueue's mutating webhook."""
        self._ready()  # fails at once if the manager died
        flavor = {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ResourceFlavor",
            "metadata": {"name": "rlkube-webhook-probe"},
        }
        try:
            created = self._client().request(
                "POST", "/apis/kueue.x-k8s.io/v1beta2/resourceflavors", flavor, query={"dryRun": "All"}
            )
        except ApiError:
            return False
        # The mutating webhook adds its finalizer: proof the API server called it.
        return "kueue.x-k8s.io/resource-in-use" in (created.get("metadata", {}).get("finalizers") or [])

    def stop(self) -> None:
        """Remove the webhook configurations, then end the manager (SIGTERM, SIGKILL after a grace)."""
        while self.webhooks and self.api is not None:
            path = self.webhooks.pop()
            try:
                self.api.delete(path)
            except (ApiError, OSError):
                pass  # the API server may be gone already
        if self.process is not None and self.process.poll() is None:
            signal_group(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(_STOP_GRACE)
            except subprocess.TimeoutExpired:
                signal_group(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.process = None
        atexit.unregister(self.stop)

    def __enter__(self) -> KueueManager:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
