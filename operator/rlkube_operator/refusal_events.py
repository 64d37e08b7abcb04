"""Events for eval pods whose fragments the coordinator refused, quarantined or evicted.

Pure (no I/O): compares the stored ``status.progress`` with the newly derived one. The
coordinator counts refusals (``fragmentsRefused``, ``fragmentsQuarantined``) and evicted pods
(``workersEvicted``), and keeps the newest few in ``refusals`` (worker, task, reason); an
increase becomes a Warning event naming the newest, so ``kubectl describe rlj`` says which pod
sent what and why without a log. Counts start again when train rank 0 restarts: only a rise
from the stored figure is news.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any


class RefusalReason(StrEnum):
    FRAGMENTS_REFUSED = "FragmentsRefused"
    EVAL_POD_EVICTED = "EvalPodEvicted"


def refusal_events(previous: Mapping[str, Any] | None, new: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(reason, message) of each Warning event ``new`` calls for against ``previous``."""
    old = dict((previous or {}).get("progress") or {})
    now = dict(new.get("progress") or {})
    refusals = [r for r in now.get("refusals") or [] if isinstance(r, Mapping)]
    newest = refusals[-1] if refusals else None
    detail = (
        f"; newest: {newest.get('worker', '?')} task {newest.get('task', '?')}: {newest.get('reason', '')}"
        if newest
        else ""
    )
    events: list[tuple[str, str]] = []
    refused, quarantined = _rise(old, now, "fragmentsRefused"), _rise(old, now, "fragmentsQuarantined")
    if refused or quarantined:
        events.append(
            (
                RefusalReason.FRAGMENTS_REFUSED.value,
                f"{now.get('fragmentsRefused', 0)} fragments refused, {now.get('fragmentsQuarantined', 0)} "
                f"quarantined (they do not fit the job's spaces, schema or finiteness){detail}",
            )
        )
    if _rise(old, now, "workersEvicted"):
        pods = sorted({str(r.get("worker", "?")).partition("#")[0] for r in refusals if r.get("evicted")})
        events.append(
            (
                RefusalReason.EVAL_POD_EVICTED.value,
                f"{now.get('workersEvicted', 0)} eval pods evicted for refused fragments "
                f"(newest: {', '.join(pods) or '?'}); their work goes to the other eval pods",
            )
        )
    return events


def _rise(old: Mapping[str, Any], new: Mapping[str, Any], name: str) -> bool:
    try:
        return int(new.get(name) or 0) > int(old.get(name) or 0)
    except (TypeError, ValueError):
        return False
