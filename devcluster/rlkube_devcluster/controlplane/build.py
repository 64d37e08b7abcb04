"""Build (once per machine) the control plane's binaries from the pinned Go module.

    python -m rlkube_devcluster.controlplane.build      # prints the directory holding them

``devcluster/kubernetes/go.mod`` requires k8s.io/kubernetes at one version and pins each of its
staging modules; go.sum fixes every dependency's hash. The binaries land in
``~/.cache/rlkube/controlplane/<version>-<go.sum sha256 prefix>/`` (``$RLKUBE_CACHE`` moves the
root), written to a temporary directory first and renamed into place when all are built, so a
directory that exists is complete. A cold build takes minutes (Go compiles all of Kubernetes);
afterwards this returns at once.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TextIO

from rlkube_devcluster import REPO

#: The Go module that pins the control plane.
GO_MODULE = REPO / "devcluster" / "kubernetes"
COMMANDS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
_FALLBACK_GO = Path("/usr/local/go/bin/go")


class BuildError(RuntimeError):
    """The control plane could not be built (no Go toolchain, or the build failed)."""


def kubernetes_version(module: Path = GO_MODULE) -> str:
    """The k8s.io/kubernetes version go.mod requires (``v1.37.2``)."""
    found = re.search(r"^require k8s\.io/kubernetes (v\S+)", (module / "go.mod").read_text(), re.M)
    if found is None:
        raise BuildError(f"{module / 'go.mod'}: expected a line 'require k8s.io/kubernetes vX.Y.Z'")
    return found.group(1)


def cache_root() -> Path:
    root = os.environ.get("RLKUBE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "rlkube"
    )
    return Path(root) / "controlplane"


def binaries_dir(module: Path = GO_MODULE) -> Path:
    """Where this module's binaries are (or will be) cached."""
    digest = hashlib.sha256((module / "go.sum").read_bytes()).hexdigest()[:12]
    return cache_root() / f"{kubernetes_version(module)}-{digest}"


def find_go() -> str:
    """The ``go`` command: ``$GO``, else ``go`` on PATH, else /usr/local/go/bin/go."""
    candidate = os.environ.get("GO") or shutil.which("go")
    if candidate is None and _FALLBACK_GO.exists():
        candidate = str(_FALLBACK_GO)
    if candidate is None or not (Path(candidate).exists() or shutil.which(candidate)):
        raise BuildError(
            "building the Kubernetes control plane needs the Go toolchain (go 1.26 or newer, "
            "https://go.dev/dl/): no `go` on PATH nor at /usr/local/go/bin/go; set GO=/path/to/go"
        )
    return candidate


def ensure_binaries(module: Path = GO_MODULE, *, log: TextIO = sys.stderr) -> Path:
    """The directory holding the three binaries, building them first when they are not cached."""
    target = binaries_dir(module)
    if _complete(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second builder waits, then finds the first one's result
        if not _complete(target):
            _build(module, target, log=log)
    return target


def _complete(target: Path) -> bool:
    return all(os.access(target / name, os.X_OK) for name in COMMANDS)


def _build(module: Path, target: Path, *, log: TextIO) -> None:
    go = find_go()
    version = kubernetes_version(module)
    minor = version.lstrip("v").split(".")[1]
    # `kubectl version` and /version report the release, not the v0.0.0 a module build carries.
    ldflags = " ".join(
        f"-X k8s.io/component-base/version.{key}={value}"
        for key, value in (("gitVersion", version), ("gitMajor", "1"), ("gitMinor", minor))
    )
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    command = [
        go,
        "build",
        "-trimpath",
        "-buildvcs=false",
        f"-ldflags={ldflags}",
        "-o",
        f"{staging}/",
        *(f"k8s.io/kubernetes/cmd/{name}" for name in COMMANDS),
    ]
    print(
        f"building the Kubernetes {version} control plane into {target} (once per machine; "
        "minutes on a cold Go cache) ...",
        file=log,
        flush=True,
    )
    try:
        result = subprocess.run(
            command,
            cwd=module,
            env={**os.environ, "CGO_ENABLED": "0"},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise BuildError(
                f"building the Kubernetes control plane failed (exit {result.returncode}): "
                f"{' '.join(command)} in {module}:\n{result.stdout[-4000:]}"
            )
        os.rename(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def main() -> int:
    try:
        print(ensure_binaries())
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
