"""`make lint` runs every linter the Makefile's header promises, with the options the tests use."""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.delivery.chart import ROOT, tool
from tests.delivery.test_e2e_script import SHELLCHECK_ARGS
from tests.delivery.test_examples import YAML_FILES

MAKEFILE = (ROOT / "Makefile").read_text()


def recipe(target: str) -> list[str]:
    found = re.search(rf"^{target}:.*\n((?:\t.*\n)+)", MAKEFILE, re.M)
    assert found, f"no {target} target"
    return [line.strip() for line in found[1].splitlines()]


def variable(name: str) -> list[str]:
    found = re.search(rf"^{name} :=((?:.*\\\n)*.*)$", MAKEFILE, re.M)
    assert found, f"no {name} variable"
    return found[1].replace("\\\n", " ").split()


def test_lint_runs_every_linter() -> None:
    lines = recipe("lint")
    for linter in (
        "ruff check",
        "ruff format --check",
        "mypy",
        "lint-imports",
        "yamllint",
        "shellcheck",
        "hadolint",
    ):
        assert any(f"/bin/{linter}" in line for line in lines), linter


def test_make_test_runs_lint_then_pytest() -> None:
    lines = recipe("test")
    assert "lint" in lines[0]
    assert any("pytest" in line for line in lines[1:])


def test_lint_checks_the_files_and_options_the_tests_check() -> None:
    assert [str(ROOT / p) for p in variable("DELIVERY_YAML")] == [str(p) for p in YAML_FILES]
    assert variable("SHELLCHECK_ARGS") == SHELLCHECK_ARGS


SHELL_SCRIPTS = sorted(
    subprocess.run(
        ["git", "ls-files", "*.sh"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
)


def test_there_are_shell_scripts_to_check() -> None:
    assert {"e2e/run.sh", "benchmarks/gpu_check.sh", "benchmarks/device_session.sh"} <= set(SHELL_SCRIPTS)


@pytest.mark.parametrize("script", SHELL_SCRIPTS)
def test_every_shell_script_is_shellchecked_by_make_lint_and_clean(script: str) -> None:
    (line,) = [line for line in recipe("lint") if "/bin/shellcheck" in line]
    assert script in line.split(), f"make lint does not shellcheck {script}"
    result = subprocess.run(
        [tool("shellcheck"), *SHELLCHECK_ARGS, str(ROOT / script)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
