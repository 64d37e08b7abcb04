"""Build (once per machine) Kueue's manager from its Go module, and find its CRDs and webhooks.

    python -m rlkube_devcluster.kueue.build      # prints the directory holding the binary

``go install sigs.k8s.io/kueue/cmd/kueue@<KUEUE_VERSION>`` (module mode: go.sum of the release
itself fixes every dependency) with ``GOBIN`` in ``~/.cache/rlkube/kueue/<version>/``
(``$RLKUBE_CACHE`` moves the root, as for the control plane), written to a temporary directory first
and renamed into place, so a directory that exists is complete. A cold build takes minutes (about
6 on 2 cores); afterwards this returns at once. The same download leaves the module's source in Go's
module cache, where :func:`module_dir` finds the CRDs (config/components/crd/bases) and the webhook
configurations (config/components/webhook/manifests.yaml) the manager needs beside it.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TextIO

from rlkube_devcluster.controlplane.build import BuildError, cache_root, find_go

#: The Kueue release the dev cluster runs (its module, its CRDs and its webhook paths).
KUEUE_VERSION = "v0.17.0"
MODULE = "sigs.k8s.io/kueue"
BINARY = "kueue"
#: The oldest Go the release builds with (its go.mod's ``go`` line).
GO_MIN = "1.25"


def binaries_dir(version: str = KUEUE_VERSION) -> Path:
    """Where this version's manager is (or will be) cached."""
    return cache_root().parent / "kueue" / version


def _go() -> str:
    try:
        return find_go()
    except BuildError:
        raise BuildError(
            f"building Kueue {KUEUE_VERSION} needs the Go toolchain (go {GO_MIN} or newer, "
            "https://go.dev/dl/): no `go` on PATH nor at /usr/local/go/bin/go; set GO=/path/to/go"
        ) from None


def _go_env(go: str, name: str) -> str:
    return subprocess.run([go, "env", name], capture_output=True, text=True, check=True).stdout.strip()


def module_dir(version: str = KUEUE_VERSION) -> Path:
    """The module's source in Go's module cache (present once it was built or downloaded)."""
    go = _go()
    found = Path(_go_env(go, "GOMODCACHE")) / f"{MODULE}@{version}"
    if not (found / "config" / "components" / "crd" / "bases").is_dir():
        subprocess.run(
            [go, "mod", "download", f"{MODULE}@{version}"], capture_output=True, text=True, check=False
        )
    if not found.is_dir():
        raise BuildError(f"the Kueue module {MODULE}@{version} is not in Go's module cache ({found})")
    return found


def crd_files(version: str = KUEUE_VERSION) -> list[Path]:
    """Kueue's CRDs (the 11 of config/components/crd/bases), sorted by name."""
    return sorted((module_dir(version) / "config" / "components" / "crd" / "bases").glob("*.yaml"))


def webhook_manifests(version: str = KUEUE_VERSION) -> Path:
    """The Mutating- and ValidatingWebhookConfiguration Kueue serves (service references, no CA)."""
    return module_dir(version) / "config" / "components" / "webhook" / "manifests.yaml"


def ensure_kueue(version: str = KUEUE_VERSION, *, log: TextIO = sys.stderr) -> Path:
    """The path of the ``kueue`` manager binary, building it first when it is not cached."""
    target = binaries_dir(version)
    if _complete(target):
        return target / BINARY
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second builder waits, then finds the first one's result
        if not _complete(target):
            _build(version, target, log=log)
    return target / BINARY


def _complete(target: Path) -> bool:
    return os.access(target / BINARY, os.X_OK)


def _build(version: str, target: Path, *, log: TextIO) -> None:
    go = _go()
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    command = [go, "install", f"{MODULE}/cmd/kueue@{version}"]
    print(
        f"building Kueue {version} into {target} (once per machine; minutes on a cold Go cache) ...",
        file=log,
        flush=True,
    )
    env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-trimpath", "GOBIN": str(staging)}
    try:
        result = subprocess.run(
            command,
            cwd=staging,  # outside any module: `go install pkg@version` builds the release as published
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise BuildError(
                f"building Kueue failed (exit {result.returncode}): {' '.join(command)}:\n"
                f"{result.stdout[-4000:]}"
            )
        os.rename(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def main() -> int:
    try:
        print(ensure_kueue().parent)
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
