"""The Dockerfile lints clean and has the agreed shape; its build context holds what it copies.

No Docker daemon here, so the image is never built in tests: the shape is checked by reading the
Dockerfile, and the wheel the builder stage makes is built from exactly the files .dockerignore
lets into the context.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.delivery.chart import ROOT, tool

DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def values(self, instruction: str) -> list[str]:
        return [args for ins, args in self.instructions if ins == instruction]


def parse_dockerfile(text: str) -> tuple[dict[str, str], list[Stage]]:
    """Global ARG defaults and the stages, with line continuations joined and comments dropped."""
    joined = re.sub(
        r"\\\n", " ", "\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith("#"))
    )
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in joined.splitlines():
        if not line.strip():
            continue
        instruction, _, args = line.strip().partition(" ")
        instruction = instruction.upper()
        if instruction == "FROM":
            base, _, name = args.partition(" AS ")
            stages.append(Stage(name=name.strip(), base=base.strip()))
        elif stages:
            stages[-1].instructions.append((instruction, args.strip()))
        elif instruction == "ARG":
            key, _, default = args.partition("=")
            global_args[key] = default
    return global_args, stages


GLOBAL_ARGS, STAGES = parse_dockerfile(DOCKERFILE.read_text())
FINAL = STAGES[-1]


def test_dockerfile_is_hadolint_clean() -> None:
    result = subprocess.run(
        [tool("hadolint"), "--failure-threshold", "style", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_cpu_torch_by_default_and_cuda_by_build_arg() -> None:
    builder = next(s for s in STAGES if s.name == "builder")
    args = dict(a.partition("=")[::2] for a in builder.values("ARG"))
    assert args["TORCH_INDEX"] == "https://download.pytorch.org/whl/cpu"
    assert any('--index-url "${TORCH_INDEX}"' in run for run in builder.values("RUN"))
    # The final stage's base is a build arg (debian slim by default, nvidia/cuda for GPU images).
    assert FINAL.base == "${BASE_IMAGE}"
    assert GLOBAL_ARGS["BASE_IMAGE"].startswith("debian:")
    assert GLOBAL_ARGS["BASE_IMAGE"].endswith("-slim")
    assert "nvidia/cuda:" in DOCKERFILE.read_text(), "the header says how to build the CUDA image"


def test_multi_stage_build_copies_only_python_and_the_venv_into_the_final_stage() -> None:
    assert len(STAGES) >= 2
    copies = FINAL.values("COPY")
    assert copies == ["--from=builder /opt/python /opt/python", "--from=builder /opt/venv /opt/venv"]
    final_runs = " ".join(FINAL.values("RUN"))
    for build_tool in ("gcc", "build-essential", "uv ", "pip install", "git"):
        assert build_tool not in final_runs, f"{build_tool!r} in the final stage"
    assert "rm -rf /var/lib/apt/lists/*" in final_runs


def test_final_stage_runs_rlkube_as_a_non_root_user() -> None:
    (user,) = FINAL.values("USER")
    uid = user.split(":")[0]
    assert uid.isdigit(), "a numeric USER lets Kubernetes check runAsNonRoot"
    assert int(uid) >= 1000
    assert f"--uid {uid}" in " ".join(FINAL.values("RUN"))
    (entrypoint,) = FINAL.values("ENTRYPOINT")
    assert entrypoint == '["/usr/bin/tini", "--", "rlkube"]'
    assert FINAL.values("CMD") == ['["--help"]']
    assert any("PATH=/opt/venv/bin:" in env for env in FINAL.values("ENV"))
    labels = " ".join(FINAL.values("LABEL"))
    for key in ("title", "description", "version", "revision", "licenses"):
        assert f"org.opencontainers.image.{key}=" in labels


def test_chart_runs_the_image_as_its_user() -> None:
    values = (ROOT / "charts" / "rlkube" / "values.yaml").read_text()
    (user,) = FINAL.values("USER")
    assert f"runAsUser: {user.split(':')[0]}" in values


# --- the build context ---------------------------------------------------------------------------


def _dockerignore_rules() -> list[tuple[bool, re.Pattern[str]]]:
    rules = []
    for raw in DOCKERIGNORE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        include = line.startswith("!")
        pattern = line.lstrip("!").strip("/")
        regex = (
            re.escape(pattern)
            .replace(r"\*\*/", "(?:.*/)?")
            .replace(r"\*\*", ".*")
            .replace(r"\*", "[^/]*")
            .replace(r"\?", "[^/]")
        )
        rules.append((include, re.compile(regex)))
    return rules


def in_build_context(relative: str) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parent folders decides."""
    parts = relative.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    kept = True
    for include, regex in _dockerignore_rules():
        if any(regex.fullmatch(c) for c in candidates):
            kept = include
    return kept


def build_context_files() -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return [f for f in listed if in_build_context(f) and (ROOT / f).is_file()]


def test_build_context_is_only_what_the_image_needs() -> None:
    context = build_context_files()
    tops = {f.split("/")[0] for f in context}
    assert tops == {"pyproject.toml", "README.md", "runtime", "operator"}
    assert not any("__pycache__" in f or f.endswith(".pyc") for f in context)
    builder = next(s for s in STAGES if s.name == "builder")
    for copy in builder.values("COPY"):
        if copy.startswith("--from"):
            continue
        *sources, _destination = copy.split()
        for source in sources:
            assert any(f == source or f.startswith(source.rstrip("/") + "/") for f in context), source


@pytest.mark.timeout(180)
def test_the_wheel_builds_from_the_build_context_alone(tmp_path: Path) -> None:
    context = tmp_path / "context"
    for relative in build_context_files():
        (context / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / relative, context / relative)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            "out",
            "./context",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=170,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (wheel,) = (tmp_path / "out").glob("rlkube-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in (
        "rlkube/cli.py",
        "rlkube/contract.py",
        "rlkube/_proto/__init__.py",
        "rlkube_operator/rbac.py",
    ):
        assert needed in names, f"{needed} missing from the wheel"
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "rlkube = rlkube.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_make_image_gpu_pairs_a_cuda_base_with_the_torch_index_of_the_same_cuda_version() -> None:
    makefile = (ROOT / "Makefile").read_text()
    base = re.search(r"^GPU_BASE_IMAGE \?= (\S+)$", makefile, re.M)
    index = re.search(r"^GPU_TORCH_INDEX \?= (\S+)$", makefile, re.M)
    assert base
    assert index
    cuda = re.search(r"nvidia/cuda:(\d+)\.(\d+)\.\d+-", base[1])
    assert cuda, base[1]
    assert index[1].endswith(f"/cu{cuda[1]}{cuda[2]}"), (base[1], index[1])
    header = DOCKERFILE.read_text()
    assert f"BASE_IMAGE={base[1]}" in header
    assert f"TORCH_INDEX={index[1]}" in header


def test_image_installs_the_torch_release_the_project_pins() -> None:
    builder = next(s for s in STAGES if s.name == "builder")
    args = dict(a.partition("=")[::2] for a in builder.values("ARG"))
    pinned = re.search(r"^TORCH_SPEC \?= torch==(\S+)$", (ROOT / "Makefile").read_text(), re.M)
    assert pinned
    assert args["TORCH_VERSION"] == pinned[1]


# --- the image and what runs in it -------------------------------------------------------------


def test_the_image_and_the_operators_pods_agree_on_user_entrypoint_and_paths() -> None:
    from rlkube import contract
    from rlkube.cli import parse_args
    from rlkube.spec import parse_job
    from rlkube_operator.render import render
    from rlkube_operator.settings import RenderSettings

    (user,) = FINAL.values("USER")
    assert user == f"{contract.IMAGE_USER_ID}:{contract.IMAGE_GROUP_ID}"
    runs = " ".join(FINAL.values("RUN"))
    assert f"--gid {contract.IMAGE_GROUP_ID}" in runs
    # Directories the pods write to exist in the image, owned by its user (volumes cover them in pods).
    made = re.search(r"install -d -o rlkube -g rlkube ([^&]+)", runs)
    assert made
    assert {contract.RUN_DIR, contract.JOB_CONFIG_PATH.rsplit("/", 1)[0]} <= set(made[1].split())
    (entrypoint,) = FINAL.values("ENTRYPOINT")
    assert entrypoint.endswith('"rlkube"]')
    job = parse_job({"metadata": {"name": "j"}, "spec": {"env": {"id": "CartPole-v1"}}})
    for obj in render(job, RenderSettings()):
        if obj["kind"] == "StatefulSet":
            (container,) = obj["spec"]["template"]["spec"]["containers"]
            assert "command" not in container
            assert parse_args(container["args"]).command == "pod"


def test_versions_agree_between_the_package_the_chart_and_the_operators_default_image() -> None:
    import tomllib

    import yaml
    from rlkube import __version__
    from rlkube_operator.settings import RenderSettings

    chart = yaml.safe_load((ROOT / "charts" / "rlkube" / "Chart.yaml").read_text())
    package = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    # `make image` tags rlkube:<pyproject version>; the chart's default image is rlkube:<appVersion>.
    assert chart["appVersion"] == package == __version__
    assert RenderSettings().default_image == f"rlkube:{chart['appVersion']}"
