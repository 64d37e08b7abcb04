"""Reading RLJob manifests from files and applying ``--set path=value`` overrides.

``apply_overrides`` is pure; ``load_job`` reads the file. Overrides use the YAML spelling
(``spec.train.maxEpochs=3``); the value is parsed as a YAML scalar or flow collection, so
``--set spec.env.kwargs={max_episode_steps: 200}`` works too.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import yaml

from rlkube.spec import RLJob, SpecError, parse_job

_SEGMENT = re.compile(r"^(?P<key>[^\[\]]+)(?P<indexes>(\[\d+\])*)$")


def apply_overrides(document: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Return a copy of ``document`` with each ``dotted.path=value`` set; bad overrides raise SpecError."""
    result = copy.deepcopy(document)
    problems: list[str] = []
    for item in overrides:
        path, sep, raw = item.partition("=")
        if not sep or not path.strip():
            problems.append(f"--set {item!r}: expected PATH=VALUE, e.g. spec.train.maxEpochs=3")
            continue
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError as exc:
            problems.append(f"--set {path}: value {raw!r} is not valid YAML ({exc.problem})")
            continue
        error = _set_path(result, path.strip(), value)
        if error:
            problems.append(f"--set {path}: {error}")
    if problems:
        raise SpecError(problems, source="overrides")
    return result


def _set_path(root: dict[str, Any], path: str, value: Any) -> str | None:
    node: Any = root
    steps: list[str | int] = []
    for segment in path.split("."):
        match = _SEGMENT.match(segment)
        if not match:
            return f"cannot parse path segment {segment!r}"
        steps.append(match["key"])
        steps.extend(int(i) for i in re.findall(r"\[(\d+)\]", match["indexes"]))
    for step, following in zip(steps, [*steps[1:], None], strict=True):
        last = following is None
        if isinstance(step, int):
            if not isinstance(node, list) or step >= len(node):
                return f"index [{step}] does not exist"
            if last:
                node[step] = value
            else:
                node = node[step]
            continue
        if not isinstance(node, dict):
            return f"{step!r} is under a value that is not a mapping"
        if last:
            node[step] = value
        else:
            node = node.setdefault(step, [] if isinstance(following, int) else {})
    return None


def read_manifest(path: str | Path) -> dict[str, Any]:
    """Parse one YAML document; errors name the file."""
    file = Path(path)
    if not file.is_file():
        raise SpecError([f"{file}: no such file"], source=str(file))
    try:
        documents = [doc for doc in yaml.safe_load_all(file.read_text()) if doc is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise SpecError(
            [f"{file}:{where} not valid YAML ({getattr(exc, 'problem', exc)})"], source=str(file)
        ) from None
    jobs = [doc for doc in documents if isinstance(doc, dict) and doc.get("kind") == "RLJob"]
    if len(documents) == 1:
        return documents[0]
    if len(jobs) == 1:
        return jobs[0]
    raise SpecError(
        [f"{file}: expected one RLJob document, found {len(jobs)} among {len(documents)}"], source=str(file)
    )


def load_job(path: str | Path, overrides: list[str] | None = None) -> RLJob:
    """Read, override and validate a job file; every problem is a :class:`SpecError` line."""
    document = read_manifest(path)
    if not isinstance(document, dict):
        raise SpecError(
            [f"(root): got {type(document).__name__}, expected a mapping (an RLJob manifest)"],
            source=str(path),
        )
    return parse_job(apply_overrides(document, overrides or []), source=str(path))


def dump_job(job: RLJob) -> str:
    """The manifest as YAML with camelCase keys (what the operator puts in the job's ConfigMap)."""
    data = job.model_dump(mode="json", by_alias=True, exclude={"status"}, exclude_none=True)
    return yaml.safe_dump(data, sort_keys=False)
