"""Writing why a pod's container stopped, where the kubelet reads it (``terminationMessagePath``).

I/O: one small file write. The pod entrypoint (:mod:`rlkube.launch.pod`) calls
:func:`write_termination_message` before it exits non-zero, for every start-up refusal and every
crash; the kubelet copies the file into the pod's ``status.containerStatuses[].state.terminated.
message`` (and ``lastState`` after a restart), and the operator turns it into the job's ``Failed``
reason and message. The format (one JSON object, at most 4096 bytes) is
:class:`rlkube.contract.TerminationMessage`, shared with the operator.

The file is the container's ``terminationMessagePath`` (:data:`rlkube.contract.TERMINATION_MESSAGE_PATH`,
which the operator renders), or ``RLKUBE_TERMINATION_MESSAGE_PATH`` where a kubelet puts it
elsewhere (the cluster-in-a-box runs containers as host processes). Outside a pod the default file
does not exist (the kubelet creates it) and nothing is written.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path

from rlkube.contract import TERMINATION_MESSAGE_PATH, termination_message

logger = logging.getLogger(__name__)

#: Set by a kubelet that mounts the termination message file somewhere else (not by the operator).
PATH_VARIABLE = "RLKUBE_TERMINATION_MESSAGE_PATH"


def termination_path(environ: Mapping[str, str] | None = None) -> Path | None:
    """Where this container's termination message goes, or None when it has no such file."""
    env = os.environ if environ is None else environ
    override = env.get(PATH_VARIABLE, "").strip()
    if override:
        return Path(override)
    default = Path(TERMINATION_MESSAGE_PATH)
    return default if default.is_file() else None


def write_termination_message(
    reason: str, message: str, *, permanent: bool | None = None, environ: Mapping[str, str] | None = None
) -> bool:
    """Write ``reason`` and ``message`` (cut to the kubelet's 4096 bytes); False when there is no file.

    ``permanent`` says that no restart can help (default: whether ``reason`` is one of
    :data:`rlkube.contract.PERMANENT_FAILURES`). Never raises: a pod that cannot say why it
    stopped still stops.
    """
    path = termination_path(environ)
    if path is None:
        return False
    try:
        path.write_text(termination_message(reason, message, permanent=permanent).encode(), encoding="utf-8")
    except OSError as exc:
        logger.warning("could not write the termination message to %s: %s", path, exc)
        return False
    return True
