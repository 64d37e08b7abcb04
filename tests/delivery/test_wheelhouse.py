"""scripts/wheelhouse.py: the wheels an offline machine lacks, for its Python, less what it has.

The walk is driven with a fake index (no network): what it asks for and what it refuses is what
``make wheelhouse`` would download or stop on.
"""

from __future__ import annotations

import importlib.util
import sys
import zipfile
from pathlib import Path
from types import ModuleType

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("wheelhouse", ROOT / "scripts" / "wheelhouse.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["wheelhouse"] = module
    spec.loader.exec_module(module)
    return module


wheelhouse = _load()


class FakeIndex:
    """One version per name, with its Requires-Dist lines; records what was fetched."""

    def __init__(self, packages: dict[str, tuple[str, list[str]]]) -> None:
        self.packages = packages
        self.fetched: list[str] = []

    def __call__(self, requirement: Requirement) -> object:
        name = canonicalize_name(requirement.name)
        version, requires = self.packages[name]
        if not requirement.specifier.contains(version):
            raise wheelhouse.WheelhouseError(f"no wheel of {requirement}")
        self.fetched.append(name)
        return wheelhouse.Wheel(name, Version(version), tuple(requires))


def walk(
    requirements: list[str], index: FakeIndex, *, present: list[str] = (), python: str = "3.12"
) -> list[str]:
    wheels = wheelhouse.walk(
        requirements,
        index,
        present=wheelhouse.parse_present(present),
        environment=wheelhouse.target_environment(python),
    )
    return sorted(w.name for w in wheels)


INDEX = {
    "tensordict": (
        "0.15.3",
        ["torch>=2.11.0a0", "numpy", "cloudpickle", 'typing_extensions>=4.0; python_version < "3.11"'],
    ),
    "cloudpickle": ("3.1.3", []),
    "typing-extensions": ("4.16.0", []),
    "gymnasium": ("1.4.0", ["numpy>=1.21", "cloudpickle", 'mujoco>=2.1.5; extra == "mujoco"']),
    "mujoco": ("4.0.1", ["numpy", "glfw"]),
    "glfw": ("2.11.0", []),
    "torch": ("2.13.0", ["nvidia-nccl-cu13==2.28.9"]),
    "numpy": ("2.5.2", []),
}


def test_stops_at_what_the_target_has_and_never_fetches_it() -> None:
    index = FakeIndex(INDEX)
    assert walk(["tensordict>=0.6"], index, present=["torch==2.11.0", "numpy"]) == [
        "cloudpickle",
        "tensordict",
    ]
    assert "torch" not in index.fetched  # nor torch's CUDA stack behind it


def test_a_present_version_that_a_requirement_refuses_is_named_with_who_asked() -> None:
    with pytest.raises(
        wheelhouse.WheelhouseError, match=r"has torch 2\.10\.0, but torch>=2\.11\.0a0 <- tensordict 0\.15\.3"
    ):
        walk(["tensordict>=0.6"], FakeIndex(INDEX), present=["torch==2.10.0", "numpy"])


def test_markers_are_the_targets_python_not_this_one() -> None:
    index = FakeIndex(INDEX)
    assert "typing-extensions" not in walk(["tensordict"], index, present=["torch", "numpy"], python="3.12")
    assert "typing-extensions" in walk(
        ["tensordict"], FakeIndex(INDEX), present=["torch", "numpy"], python="3.10"
    )


def test_an_extra_brings_its_requirements_even_after_the_plain_name_was_walked() -> None:
    index = FakeIndex(INDEX)
    assert walk(["gymnasium"], index, present=["numpy"]) == ["cloudpickle", "gymnasium"]
    found = walk(["gymnasium>=1.1", "gymnasium[mujoco]>=1.1"], FakeIndex(INDEX), present=["numpy"])
    assert found == ["cloudpickle", "glfw", "gymnasium", "mujoco"]


def test_a_second_requirement_the_chosen_version_misses_stops_the_walk() -> None:
    index = FakeIndex({**INDEX, "old": ("1.0", ["cloudpickle<3"])})
    chosen_first = r"cloudpickle 3\.1\.3 was chosen first, but cloudpickle<3 <- old 1\.0"
    with pytest.raises(wheelhouse.WheelhouseError, match=chosen_first):
        walk(["gymnasium", "old"], index, present=["numpy"])


def test_a_dependency_cycle_ends() -> None:
    index = FakeIndex({"a": ("1.0", ["b"]), "b": ("1.0", ["a>=1"])})
    assert walk(["a"], index) == ["a", "b"]
    assert index.fetched == ["a", "b"]


def test_present_entries_must_name_a_package() -> None:
    with pytest.raises(wheelhouse.WheelhouseError, match="NAME or NAME==VERSION"):
        wheelhouse.parse_present(["==1.0"])


def test_the_projects_extras_unfold_through_self_references() -> None:
    requirements = wheelhouse.project_requirements(["bench"])
    names = {canonicalize_name(Requirement(r).name) for r in requirements}
    assert {
        "torch",
        "tensordict",
        "stable-baselines3",
        "ale-py",
        "gymnasium",
    } <= names  # envs via rlkube[envs]
    assert "rlkube" not in names
    with pytest.raises(wheelhouse.WheelhouseError, match="no extra 'gpu'"):
        wheelhouse.project_requirements(["gpu"])


def test_a_wheels_requirements_are_read_from_its_metadata(tmp_path: Path) -> None:
    path = tmp_path / "demo_pkg-1.2.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(
            "demo_pkg-1.2.0.dist-info/METADATA",
            "Metadata-Version: 2.1\nName: demo-pkg\nVersion: 1.2.0\n"
            "Requires-Dist: numpy>=1.26\nRequires-Dist: rich; extra == 'pretty'\n",
        )
    wheel = wheelhouse.wheel_metadata(path)
    assert (wheel.name, wheel.version) == ("demo-pkg", Version("1.2.0"))
    assert wheel.requires == ("numpy>=1.26", "rich; extra == 'pretty'")
