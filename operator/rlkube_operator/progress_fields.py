"""The coordinator's ``JobStatus`` fields that ``status.progress`` shows as they are: values and schema.

Pure (no I/O, no grpc): both come from the proto descriptor, so a field added to ``JobStatus``
in proto/rlkube/v1/policy_group.proto shows up in ``kubectl get rlj -o yaml`` (under its JSON
name, ``dropped_stale`` -> ``droppedStale``) and in the CRD's schema of ``status.progress``
with no other edit. ``coordinator.report_from_proto`` copies the values into
:attr:`~rlkube_operator.status.CoordinatorReport.shown`; ``crd.build_crd`` lists the fields.

Every ``JobStatus`` field is shown except:

* the fields :class:`~rlkube_operator.status.CoordinatorReport` names, which ``status.py``
  reads, decides with or reshapes (rounded returns, an RFC 3339 sync time, sorted nodes);
* :data:`NOT_PROGRESS`, fields that are not progress figures (each says why).
"""

from __future__ import annotations

import math
from dataclasses import fields
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from rlkube._proto import policy_group_pb2 as pb

from rlkube_operator.status import CoordinatorReport

#: JobStatus fields kept out of ``status.progress``, and why.
NOT_PROGRESS: dict[str, str] = {
    "phase": "the RLJob's phase and conditions are derived from it",
    "phase_name": "the phase as text, for operators that predate JobStatus.phase",
    "finished": "the Complete condition says it",
    "message": "status.message and the conditions' messages say it",
    "workers": "one entry per eval worker: unbounded (rlkube status lists them)",
    "incarnation": "names a process of train rank 0, not a figure of the run",
}

_INTEGERS = frozenset(
    {
        FieldDescriptor.TYPE_INT32,
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_UINT32,
        FieldDescriptor.TYPE_UINT64,
        FieldDescriptor.TYPE_SINT32,
        FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_FIXED32,
        FieldDescriptor.TYPE_FIXED64,
        FieldDescriptor.TYPE_SFIXED32,
        FieldDescriptor.TYPE_SFIXED64,
    }
)
_NUMBERS = frozenset({FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT})

#: A message descriptor (``pb.JobStatus.DESCRIPTOR``: upb's or the pure-Python class, alike here).
Descriptor = Any


def shown_fields(descriptor: Descriptor = pb.JobStatus.DESCRIPTOR) -> list[FieldDescriptor]:
    """The fields of ``descriptor`` that ``status.progress`` shows as they are, in proto order."""
    named = {f.name for f in fields(CoordinatorReport)}
    return [f for f in descriptor.fields if f.name not in named and f.name not in NOT_PROGRESS]


def shown_values(message: Message) -> dict[str, Any]:
    """JSON name -> JSON value of the shown fields of ``message`` (an unset optional field is left out)."""
    out: dict[str, Any] = {}
    for f in shown_fields(message.DESCRIPTOR):
        if f.has_presence and not f.is_repeated and not message.HasField(f.name):
            continue
        value = getattr(message, f.name)
        converted = [_value(f, v) for v in value] if f.is_repeated else _value(f, value)
        if converted is not None:
            out[f.json_name] = converted
    return out


def shown_schema(descriptor: Descriptor = pb.JobStatus.DESCRIPTOR) -> dict[str, dict[str, Any]]:
    """The structural OpenAPI schema of each shown field, by JSON name (for the CRD)."""
    return {
        f.json_name: {
            **_schema(f),
            "description": f"The coordinator's JobStatus.{f.name} (see proto/rlkube/v1/policy_group.proto).",
        }
        for f in shown_fields(descriptor)
    }


def _value(f: FieldDescriptor, value: Any) -> Any:
    if f.type == FieldDescriptor.TYPE_MESSAGE:
        return {
            sub.json_name: [_value(sub, v) for v in getattr(value, sub.name)]
            if sub.is_repeated
            else _value(sub, getattr(value, sub.name))
            for sub in _fields_of(f)
        }
    if f.type == FieldDescriptor.TYPE_ENUM:
        number = int(value)
        assert f.enum_type is not None
        known = f.enum_type.values_by_number.get(number)
        return known.name if known is not None else str(number)
    if f.type in _INTEGERS:
        return int(value)
    if f.type in _NUMBERS:
        return float(value) if math.isfinite(value) else None  # JSON has no NaN
    if f.type == FieldDescriptor.TYPE_BYTES:
        return None  # not a figure to show
    return value  # bool, str


def _fields_of(f: FieldDescriptor) -> list[FieldDescriptor]:
    assert f.message_type is not None
    return list(f.message_type.fields)


def _schema(f: FieldDescriptor) -> dict[str, Any]:
    one = _scalar_schema(f)
    return {"type": "array", "items": one} if f.is_repeated else one


def _scalar_schema(f: FieldDescriptor) -> dict[str, Any]:
    if f.type == FieldDescriptor.TYPE_MESSAGE:
        return {
            "type": "object",
            "properties": {sub.json_name: _schema(sub) for sub in _fields_of(f)},
        }
    if f.type == FieldDescriptor.TYPE_ENUM:
        return {"type": "string"}  # the value's name (a newer coordinator's value: its number)
    if f.type in _INTEGERS:
        return {"type": "integer"}
    if f.type in _NUMBERS:
        return {"type": "number"}
    if f.type == FieldDescriptor.TYPE_BOOL:
        return {"type": "boolean"}
    return {"type": "string"}
