"""Wheels of rlkube's dependencies for a machine with no network, less what it already has.

A GPU node behind an air gap (or a lent machine with no package index) often has torch and CUDA
but not rlkube's other dependencies. This gathers the wheels it lacks, for *its* Python and
platform, into one folder:

    python scripts/wheelhouse.py --dest .whl --python-version 3.12 --extras envs \\
        --present torch==2.11.0 --present numpy==2.5.2

and there they install with no index, onto PYTHONPATH beside the machine's own packages:

    python3 -m pip install --no-index --no-deps --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site:$PWD/runtime:$PWD/operator

``pip download`` alone cannot do it: resolving for another platform pulls torch's whole CUDA
stack (gigabytes) back in, since pip cannot be told a package is already there. So this walks the
dependency tree itself, one ``pip download --no-deps`` per package, reading each wheel's
``Requires-Dist`` with the target's markers, and stops at every name ``--present`` gives. A present
name with a version is checked against every requirement on it; a conflict, or a package with no
wheel for the target, stops the walk with the chain of requirements that led to it.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from email.parser import Parser
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

#: What pip accepts for an x86-64 Linux machine with glibc 2.28 or newer (most GPU images).
MANYLINUX_X86_64 = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
)
ROOT = Path(__file__).resolve().parent.parent


class WheelhouseError(Exception):
    """A requirement the target cannot meet from wheels; the message names it and who asked."""


@dataclass(frozen=True)
class Wheel:
    name: str  # canonical
    version: Version
    requires: tuple[str, ...]  # Requires-Dist lines, markers and all
    path: Path | None = None


Fetch = Callable[[Requirement], Wheel]


def target_environment(python_version: str) -> dict[str, str]:
    """Marker values of a CPython ``python_version`` (e.g. ``3.12``) on x86-64 Linux."""
    environment = {key: str(value) for key, value in default_environment().items()}
    major_minor = ".".join(python_version.split(".")[:2])
    full = python_version if python_version.count(".") == 2 else f"{major_minor}.0"
    environment.update(
        python_version=major_minor,
        python_full_version=full,
        implementation_name="cpython",
        implementation_version=full,
        platform_python_implementation="CPython",
        sys_platform="linux",
        platform_system="Linux",
        platform_machine="x86_64",
        os_name="posix",
    )
    return environment


def applies(requirement: Requirement, environment: dict[str, str], extras: Iterable[str]) -> bool:
    """Whether ``requirement`` is needed on the target with the asker's ``extras``."""
    if requirement.marker is None:
        return True
    return any(requirement.marker.evaluate({**environment, "extra": extra}) for extra in ("", *extras))


def parse_present(entries: Iterable[str]) -> dict[str, Version | None]:
    """``NAME`` or ``NAME==VERSION`` per entry: what the target already has."""
    present: dict[str, Version | None] = {}
    for entry in entries:
        name, _, version = entry.partition("==")
        if not name.strip():
            raise WheelhouseError(f"--present {entry!r}: give NAME or NAME==VERSION")
        present[canonicalize_name(name.strip())] = Version(version.strip()) if version.strip() else None
    return present


def walk(
    requirements: Iterable[str],
    fetch: Fetch,
    *,
    present: dict[str, Version | None],
    environment: dict[str, str],
) -> list[Wheel]:
    """Every wheel the target lacks for ``requirements``, in the order first needed."""
    chosen: dict[str, Wheel] = {}
    expanded: set[tuple[str, frozenset[str]]] = set()  # (name, extras) whose requirements are queued
    queue: list[tuple[Requirement, tuple[str, ...]]] = [(Requirement(r), ()) for r in requirements]
    while queue:
        requirement, chain = queue.pop(0)
        name = canonicalize_name(requirement.name)
        asked = " <- ".join((str(requirement), *chain))
        if name in present:
            have = present[name]
            if have is not None and not requirement.specifier.contains(have, prereleases=True):
                raise WheelhouseError(f"the target has {name} {have}, but {asked}")
            continue
        wheel = chosen.get(name)
        if wheel is None:
            wheel = chosen[name] = fetch(requirement)
        elif not requirement.specifier.contains(wheel.version, prereleases=True):
            raise WheelhouseError(f"{name} {wheel.version} was chosen first, but {asked}")
        if (name, frozenset(requirement.extras)) in expanded:
            continue
        expanded.add((name, frozenset(requirement.extras)))
        for line in wheel.requires:
            needed = Requirement(line)
            if applies(needed, environment, requirement.extras):
                needed.marker = None
                queue.append((needed, (f"{name} {wheel.version}", *chain)))
    return list(chosen.values())


def project_requirements(extras: Iterable[str], pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """rlkube's dependencies and those of ``extras``, self-references (``rlkube[envs]``) unfolded."""
    project = tomllib.loads(pyproject.read_text())["project"]
    optional: dict[str, list[str]] = project.get("optional-dependencies", {})
    wanted, seen, out = list(extras), set(), list(project["dependencies"])
    while wanted:
        extra = wanted.pop()
        if extra in seen:
            continue
        if extra not in optional:
            raise WheelhouseError(f"pyproject.toml has no extra {extra!r} (it has {', '.join(optional)})")
        seen.add(extra)
        for line in optional[extra]:
            requirement = Requirement(line)
            if canonicalize_name(requirement.name) == canonicalize_name(project["name"]):
                wanted.extend(requirement.extras)
            else:
                out.append(line)
    return out


def wheel_metadata(path: Path) -> Wheel:
    name, version, _, _ = parse_wheel_filename(path.name)
    with zipfile.ZipFile(path) as archive:
        (metadata,) = [n for n in archive.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)]
        message = Parser().parsestr(archive.read(metadata).decode())
    return Wheel(name, version, tuple(message.get_all("Requires-Dist") or ()), path)


def pip_fetch(dest: Path, python_version: str, platforms: Iterable[str]) -> Fetch:
    """Downloads one requirement's wheel for the target with ``pip download --no-deps``."""
    dest.mkdir(parents=True, exist_ok=True)
    platform_args = [arg for platform in platforms for arg in ("--platform", platform)]

    def fetch(requirement: Requirement) -> Wheel:
        plain = Requirement(str(requirement))
        plain.marker, plain.extras = None, set()
        command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:"]
        command += ["--python-version", python_version, "--implementation", "cp", *platform_args]
        command += ["--dest", str(dest), str(plain)]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            reason = (result.stderr.strip().splitlines() or ["pip download failed"])[-1]
            raise WheelhouseError(f"no wheel of {plain} for CPython {python_version}: {reason}")
        name = canonicalize_name(requirement.name)
        matches = [p for p in dest.glob("*.whl") if parse_wheel_filename(p.name)[0] == name]
        wheels = [wheel_metadata(p) for p in matches]
        wheels = [w for w in wheels if plain.specifier.contains(w.version, prereleases=True)]
        if not wheels:
            raise WheelhouseError(f"pip downloaded no wheel named {name} into {dest}")
        return max(wheels, key=lambda w: w.version)

    return fetch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dest", type=Path, default=ROOT / ".whl")
    parser.add_argument("--python-version", default="3.12", help="the target's CPython, e.g. 3.12")
    parser.add_argument("--platform", action="append", help=f"pip platform tags (default {MANYLINUX_X86_64})")
    parser.add_argument("--extras", default="", help="rlkube's extras to include, comma-separated")
    parser.add_argument("--present", action="append", default=[], help="NAME or NAME==VERSION the target has")
    parser.add_argument(
        "--leave-out", action="append", default=[], help="NAME not to carry: the target will not import it"
    )
    parser.add_argument(
        "--budget-mb", type=float, default=0, help="fail when the wheels pass this (0: no limit)"
    )
    parser.add_argument("requirement", nargs="*", help="more requirements beside rlkube's")
    args = parser.parse_args(argv)
    try:
        extras = [e.strip() for e in args.extras.split(",") if e.strip()]
        requirements = [*project_requirements(extras), *args.requirement]
        fetch = pip_fetch(args.dest, args.python_version, args.platform or MANYLINUX_X86_64)
        environment = target_environment(args.python_version)
        present = parse_present([*args.present, *args.leave_out])
        wheels = walk(requirements, fetch, present=present, environment=environment)
    except WheelhouseError as exc:
        print(f"wheelhouse: {exc}", file=sys.stderr)
        return 1
    keep = {w.path for w in wheels}
    for stray in args.dest.glob("*.whl"):  # from an earlier run with other choices
        if stray not in keep:
            stray.unlink()
    total = sum(p.stat().st_size for p in keep if p is not None) / 2**20
    for wheel in sorted(wheels, key=lambda w: w.name):
        size = wheel.path.stat().st_size / 2**20 if wheel.path else 0.0
        print(f"{wheel.name:32} {wheel.version!s:14} {size:7.1f} MiB")
    print(f"{len(wheels)} wheels, {total:.1f} MiB in {args.dest} for CPython {args.python_version}")
    if args.budget_mb and total > args.budget_mb:
        print(f"wheelhouse: {total:.1f} MiB is over the budget of {args.budget_mb:g} MiB", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
