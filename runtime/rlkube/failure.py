"""Why a run failed, in words a user can act on: the exception, its message and the user's frame.

Pure: no I/O, standard library only (the operator may import it). One function builds a
:class:`Failure` from a live exception (:func:`describe_exception`, for a pod's entrypoint or the
in-process runner); another builds the same from the traceback a process printed
(:func:`failure_from_log`, for a supervisor that only has the log). Both find the policy's frame:
the innermost frame of the traceback that is neither rlkube's nor an installed package's nor the
standard library's, and name the stage by the BasePolicy method it ran in (``rollout_step`` ->
reason ``RolloutStepFailed``) or ``EnvFailed`` when the env group called it.

:class:`Failure` is what the console and ``summary.json`` show. What a pod tells the kubelet
(its termination message, read by the operator) is :class:`rlkube.contract.TerminationMessage`,
written by :mod:`rlkube.launch.termination` from this failure's ``reason`` and ``message``.
"""

from __future__ import annotations

import os
import re
import sysconfig
import traceback
from collections.abc import Sequence
from dataclasses import asdict, dataclass

#: BasePolicy methods a user writes or overrides; a frame in one of them names the stage.
POLICY_METHODS = (
    "construct_network",
    "setup_optimizer",
    "rollout_step",
    "postprocess",
    "update_dataset",
    "train",
    "get_trainable_parameters",
    "load_state_dict",
    "init_eval",
    "init_train",
    "wrap_with_ddp",
    "save_checkpoint",
    "load_checkpoint",
)

_RLKUBE_DIR = os.path.dirname(os.path.abspath(__file__))
_ENV_DIR = os.path.join(_RLKUBE_DIR, "envs")
_LIBRARY_DIRS = tuple(
    {
        os.path.abspath(p)
        for key in ("stdlib", "platstdlib", "purelib", "platlib")
        if (p := sysconfig.get_path(key))
    }
)


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    function: str
    code: str = ""

    def describe(self) -> str:
        code = f": {self.code}" if self.code else ""
        return f"{self.function} ({self.file}:{self.line}){code}"


@dataclass(frozen=True)
class Failure:
    """A failure as reported to the user: ``reason`` (CamelCase) and a one-paragraph ``message``."""

    reason: str
    exception: str  # the exception's type name
    detail: str  # the exception's message
    frame: Frame | None = None  # the policy's (user's) frame, innermost
    pod: str | None = None

    @property
    def message(self) -> str:
        where = f"\n  in {self.frame.describe()}" if self.frame is not None else ""
        who = f"{self.pod}: " if self.pod else ""
        return f"{who}{self.exception}: {self.detail}{where}"

    def with_pod(self, pod: str | None) -> Failure:
        return Failure(self.reason, self.exception, self.detail, self.frame, pod)

    def to_json(self) -> dict[str, object]:
        data = asdict(self)
        data["message"] = self.message
        return data


def describe_exception(exc: BaseException, *, pod: str | None = None) -> Failure:
    """The Failure of a live exception (its traceback chain included)."""
    frames = [
        Frame(f.filename, f.lineno or 0, f.name, (f.line or "").strip())
        for f in traceback.extract_tb(exc.__traceback__)
    ]
    return classify(type(exc).__name__, str(exc), frames, pod=pod)


def classify(exception: str, detail: str, frames: Sequence[Frame], *, pod: str | None = None) -> Failure:
    """Reason and user frame from a traceback's frames (outermost first)."""
    user = [(i, f) for i, f in enumerate(frames) if is_user_file(f.file)]
    frame = user[-1][1] if user else None
    reason = "Failed"
    through_envs = [i for i, f in enumerate(frames) if os.path.abspath(f.file).startswith(_ENV_DIR + os.sep)]
    if (through_envs and (not user or user[-1][0] > through_envs[0])) or exception == "EnvError":
        reason = "EnvFailed"
    else:
        for _, f in reversed(user):
            if f.function in POLICY_METHODS:
                reason = "".join(part.capitalize() for part in f.function.split("_")) + "Failed"
                break
        else:
            if exception in ("RequestError",):
                reason = "RolloutStepFailed"
            elif frame is not None:
                reason = "PolicyFailed"
    return Failure(reason=reason, exception=exception, detail=detail.strip(), frame=frame, pod=pod)


def is_user_file(path: str) -> bool:
    """Not rlkube's own code, not an installed package, not the standard library, not ``<string>``."""
    if not path or path.startswith("<"):
        return False
    full = os.path.abspath(path)
    if full.startswith(_RLKUBE_DIR + os.sep):
        return False
    if any(part in ("site-packages", "dist-packages") for part in full.split(os.sep)):
        return False
    return not any(full.startswith(lib + os.sep) for lib in _LIBRARY_DIRS if "site-packages" not in lib)


_FRAME_LINE = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<function>\S+)')
_EXCEPTION_LINE = re.compile(
    r"^(?P<type>[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Warning|Failed)?)(: (?P<detail>.*))?$"
)


def failure_from_log(text: str, *, pod: str | None = None) -> Failure | None:
    """The Failure of the last Python traceback printed in ``text`` (a process's output), or None."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last):")]
    if not starts:
        return None
    block = lines[starts[-1] + 1 :]
    frames: list[Frame] = []
    i = 0
    while i < len(block):
        match = _FRAME_LINE.match(block[i])
        if match is None:
            if block[i].startswith(" "):  # code, caret markers, or a nested frame's context
                i += 1
                continue
            break
        code = ""
        if i + 1 < len(block) and block[i + 1].startswith("    ") and not _FRAME_LINE.match(block[i + 1]):
            code = block[i + 1].strip()
        frames.append(Frame(match["file"], int(match["line"]), match["function"], code))
        i += 1
    if i >= len(block):
        return None
    head = block[i]
    exception, _, detail = head.partition(": ")
    rest = []
    for line in block[i + 1 :]:
        if (
            not line.strip()
            or line.startswith(("====", "rlkube pod:"))
            or re.match(r"^\d\d:\d\d:\d\d|^\d{4}-", line)
        ):
            break
        rest.append(line)
    detail = "\n".join([detail, *rest]).strip()
    return classify(exception.rsplit(".", 1)[-1], detail, frames, pod=pod)


def format_console(failure: Failure) -> str:
    """What a console shows: the reason and the message."""
    return f"{failure.reason}: {failure.message}"


__all__ = [
    "Failure",
    "Frame",
    "classify",
    "describe_exception",
    "failure_from_log",
    "format_console",
]
