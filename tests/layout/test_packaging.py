"""The house's rules that are about packaging rather than behaviour."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "runtime"), str(ROOT / "operator")])}
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=False
    )


def test_operator_is_a_source_root_not_a_package_that_would_shadow_the_standard_library() -> None:
    assert not (ROOT / "operator" / "__init__.py").exists()
    result = run_python("import operator, sys; print(operator.__file__ or '')")
    assert result.returncode == 0, result.stderr
    assert "lib/python" in result.stdout  # the standard library's operator module


def test_the_operator_imports_without_torch_or_the_heavy_runtime() -> None:
    code = (
        "import sys\n"
        "import rlkube_operator.handlers, rlkube_operator.render, rlkube_operator.status\n"
        "import rlkube_operator.crd\n"
        "import rlkube_operator.cli, rlkube_operator.reconcile, rlkube_operator.coordinator\n"
        "heavy = sorted(m for m in ('torch', 'tensordict', 'gymnasium', 'rlkube.engine', 'rlkube.weights') "
        "if m in sys.modules)\n"
        "print(','.join(heavy))\n"
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""


def test_the_rlkube_command_answers_without_loading_torch() -> None:
    result = run_python(
        "import sys; from rlkube.cli import main; main(['crd']); print('torch' in sys.modules)"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("False")
    assert "kind: CustomResourceDefinition" in result.stdout
