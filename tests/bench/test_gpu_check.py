"""benchmarks/gpu_check.sh: its CPU fallback runs every section and prints one table.

Shellcheck: tests/delivery/test_makefile.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"


def test_make_gpu_check_runs_the_script() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^gpu-check: .*\n\tbash benchmarks/gpu_check\.sh", makefile, flags=re.M)


@pytest.mark.slow
def test_forced_cpu_fallbacks_run_every_section_and_end_with_one_table() -> None:
    env = {**os.environ, "RLKUBE_GPU_CHECK_CPU": "1", "PYTHON": sys.executable, "GPU_CHECK_TIMEOUT": "400"}
    result = subprocess.run(
        ["bash", str(SCRIPT), "--mb", "4"], capture_output=True, text=True, timeout=450, check=False, env=env
    )
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    lines = {
        m[1]: dict(re.findall(r"(\w+)=(\S+)", m[2])) for m in re.finditer(r"^\[([\w-]+)\] (.*)$", out, re.M)
    }
    assert lines["backend"]["resolved"] == "gloo"  # auto without CUDA
    assert lines["placement"]["refused"] == "True"
    weights = lines["weights-4"]
    assert weights["exact"] == "True"
    for figure in ("publish_gbps", "load_gbps", "ceiling_d2h_gbps", "ceiling_h2d_gbps"):
        assert float(weights[figure]) > 0
    assert lines["cartpole"]["learner"] == "cpu"  # the train rank logged its device
    assert lines["cartpole"]["epochs"] == "2"
    assert float(lines["halfcheetah"]["gpu_over_cpu"]) > 0
    checkpoint = lines["checkpoint"]
    assert int(checkpoint["resumed_from_epoch"]) >= int(checkpoint["killed_after_epoch"])
    assert int(checkpoint["epochs"]) == int(checkpoint["resumed_from_epoch"]) + 2
    table = out[out.index("section  ") :]
    for section in ("packages", "backend", "placement", "weights-4", "cartpole", "halfcheetah", "checkpoint"):
        assert re.search(rf"^{section} +PASS ", table, re.M), table
    assert re.search(r"^ddp +SKIP .*needs a second GPU", table, re.M)
    assert "gpu check: all passed" in out


def test_missing_packages_are_named_by_their_pip_names() -> None:
    from benchmarks.gpu.packages import Package, describe_missing, missing

    wanted = (Package("json", "json", "x"), Package("no_such_module_rlkube", "no-such-wheel", "halfcheetah"))
    lacking = missing(wanted)
    assert [p.pip for p in lacking] == ["no-such-wheel"]
    text = describe_missing(lacking)
    assert "no-such-wheel (import no_such_module_rlkube; needed by halfcheetah)" in text
    assert "pip install no-such-wheel" in text


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
