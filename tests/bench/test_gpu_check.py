"""benchmarks/gpu_check.sh: shellcheck-clean; without a GPU its CPU fallbacks run and report figures."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.delivery.chart import tool
from tests.delivery.test_e2e_script import SHELLCHECK_ARGS

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"


def test_the_script_is_shellcheck_clean_and_linted_by_make_lint() -> None:
    result = subprocess.run(
        [tool("shellcheck"), *SHELLCHECK_ARGS, str(SCRIPT)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"shellcheck \$\(SHELLCHECK_ARGS\) .*benchmarks/gpu_check\.sh", makefile)
    assert re.search(r"^gpu-check: .*\n\tbash benchmarks/gpu_check\.sh", makefile, flags=re.M)


@pytest.mark.slow
def test_forced_cpu_fallbacks_run_every_section_and_print_figures() -> None:
    env = {**os.environ, "RLKUBE_GPU_CHECK_CPU": "1", "PYTHON": sys.executable, "GPU_CHECK_TIMEOUT": "300"}
    result = subprocess.run(
        ["bash", str(SCRIPT), "--mb", "4"], capture_output=True, text=True, timeout=360, check=False, env=env
    )
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    lines = {
        m[1]: dict(re.findall(r"(\w+)=(\S+)", m[2])) for m in re.finditer(r"^\[(\w+)\] (.*)$", out, re.M)
    }
    assert lines["backend"]["resolved"] == "gloo"  # auto without CUDA
    weights = lines["weights"]
    assert weights["mode"] == "cpu-fallback"
    assert weights["exact"] == "True"
    for stage in ("device_to_pinned", "publish", "shm_to_device"):
        assert float(weights[f"{stage}_ms"]) > 0
        assert float(weights[f"{stage}_gbps"]) > 0
    ddp = lines["ddp"]
    assert (ddp["ranks"], ddp["backend"], ddp["device"], ddp["ranks_agree"]) == ("2", "gloo", "cpu", "True")
    assert float(ddp["step_ms"]) > 0
    assert "gpu check: all passed" in out


def test_without_a_venv_or_python_it_says_how_to_set_up(tmp_path: Path) -> None:
    copy = tmp_path / "benchmarks" / "gpu_check.sh"  # a checkout without .venv
    copy.parent.mkdir()
    copy.write_text(SCRIPT.read_text())
    env = {k: v for k, v in os.environ.items() if k != "PYTHON"}
    result = subprocess.run(
        ["bash", str(copy)], capture_output=True, text=True, timeout=60, check=False, env=env
    )
    assert result.returncode == 2
    assert "make gpu-check" in result.stderr
