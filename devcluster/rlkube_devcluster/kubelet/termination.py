"""The kubelet's termination message handling, for the node agent (:mod:`.node_agent`).

A real kubelet creates an empty file on the host for each container start, bind-mounts it at the
container's ``terminationMessagePath`` (default ``/dev/termination-log``) and, when the container
exits, copies at most 4096 bytes of it into ``state.terminated.message``. With
``terminationMessagePolicy: FallbackToLogsOnError`` an empty file and a non-zero exit code make it
use the last 80 lines (at most 2048 bytes) of the container's log instead. Here the container is a
host process, so the file's host path is passed in ``RLKUBE_TERMINATION_MESSAGE_PATH`` (which
rlkube's entrypoint honours: :mod:`rlkube.launch.termination`).
"""

from __future__ import annotations

from pathlib import Path

from rlkube.contract import TERMINATION_MESSAGE_MAX_BYTES
from rlkube.launch.termination import PATH_VARIABLE as TERMINATION_PATH_VARIABLE

from rlkube_devcluster.kubelet.pod_run import PodRun

#: The kubelet's fallback: the log's last lines, at most this many of them and bytes.
FALLBACK_LINES = 80
FALLBACK_BYTES = 2048

__all__ = ["TERMINATION_PATH_VARIABLE", "fresh_termination_file", "termination_message"]


def termination_file(run: PodRun) -> Path:
    return run.log_dir / "termination-log"


def fresh_termination_file(run: PodRun) -> Path:
    """An empty file for the container start about to happen (one per start, as the kubelet makes)."""
    path = termination_file(run)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")
    return path


def termination_message(run: PodRun, *, failed: bool) -> str:
    """What the kubelet reports as the exited container's ``terminated.message`` ('' for none)."""
    path = termination_file(run)
    try:
        with path.open("rb") as handle:
            written = handle.read(TERMINATION_MESSAGE_MAX_BYTES)
    except OSError:
        written = b""
    if written:
        return written.decode("utf-8", errors="replace")
    policy = run.container.get("terminationMessagePolicy", "File")
    if not failed or policy != "FallbackToLogsOnError" or run.log_file is None:
        return ""
    try:
        lines = run.log_file.read_bytes().splitlines()[-FALLBACK_LINES:]
    except OSError:
        return ""
    return b"\n".join(lines)[-FALLBACK_BYTES:].decode("utf-8", errors="replace")
