"""kubectl for the tests on the real control plane: /usr/bin/kubectl with a kubeconfig.

The dev cluster itself (the control plane, the node agents, the operator as a process, fake
coordinators, ``wait_for``) is the ``rlkube_devcluster`` source root (devcluster/); this module
holds only what the tests add: the repository root, a ``kubectl`` that fails a CI run (and skips
elsewhere) when kubectl is not installed, and :class:`Watch`, kubectl's watch in the background.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
KUBECTL = shutil.which("kubectl") or "/usr/bin/kubectl"


def kubectl(
    kubeconfig: Path, *args: str, input: str | None = None, timeout: float = 120.0, check: bool = True
) -> subprocess.CompletedProcess[str]:
    if not Path(KUBECTL).is_file():
        import pytest

        if os.environ.get("CI"):  # CI must run the operator tests, not skip them quietly
            pytest.fail(f"kubectl is not installed (looked on PATH and at {KUBECTL}); CI needs it")
        pytest.skip("kubectl is not installed")
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    cache = kubeconfig.parent / "kubectl-cache"
    result = subprocess.run(
        [KUBECTL, "--cache-dir", str(cache), *args],
        env=env,
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
    return result


@dataclass(frozen=True)
class Seen:
    at: float  # time.monotonic() when kubectl printed it
    type: str  # ADDED | MODIFIED | DELETED
    obj: dict[str, Any]


class Watch:
    """``kubectl get KIND [NAME] --watch --output-watch-events -o json`` in the background (in
    ``namespace``, or all of them when it is None).

    ``seen`` is every event the API server sent from the start (the objects as they are first),
    in order; :meth:`stop` ends kubectl.
    """

    def __init__(self, kubeconfig: Path, namespace: str | None, kind: str, name: str | None = None) -> None:
        self.seen: list[Seen] = []
        where = ["-n", namespace] if namespace else ["--all-namespaces"]
        command = [KUBECTL, "--kubeconfig", str(kubeconfig), *where, "get", kind]
        command += [name] if name else []
        self.process = subprocess.Popen(
            [*command, "--watch", "--output-watch-events", "-o", "json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    @property
    def objects(self) -> list[dict[str, Any]]:
        return [event.obj for event in list(self.seen)]

    def _read(self) -> None:
        assert self.process.stdout is not None
        decoder = json.JSONDecoder()
        buffer = ""
        for line in self.process.stdout:
            buffer += line
            while buffer.strip():
                try:
                    event, end = decoder.raw_decode(buffer.lstrip())
                except ValueError:
                    break  # an object still arriving
                self.seen.append(Seen(time.monotonic(), event["type"], event["object"]))
                buffer = buffer.lstrip()[end:]

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()
        self.thread.join(10)
