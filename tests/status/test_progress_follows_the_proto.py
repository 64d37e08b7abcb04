"""status.progress follows the coordinator's JobStatus: a field added to the proto is shown, nothing else.

The operator copies every JobStatus figure it does not reshape into ``status.progress`` from the
proto descriptor, and lists the same fields in the CRD's schema, so adding a status figure is a
proto field and the line on rank 0 that sets it.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import jsonschema
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message
from rlkube._proto import policy_group_pb2 as pb
from rlkube_operator.coordinator import report_from_proto
from rlkube_operator.crd import build_crd
from rlkube_operator.progress_fields import NOT_PROGRESS, shown_fields, shown_schema
from rlkube_operator.status import Progress, derive_status

from tests.status.test_derive_status import READY, job

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


def some_value(f: FieldDescriptor, index: int) -> Any:
    """A value of ``f``'s type that is not its default (what a test sets to see it travel)."""
    if f.type == FieldDescriptor.TYPE_ENUM:
        assert f.enum_type is not None
        return f.enum_type.values[-1].name
    if f.type in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return 0.5 + index
    if f.type == FieldDescriptor.TYPE_BOOL:
        return True
    if f.type == FieldDescriptor.TYPE_STRING:
        return f"value-{index}"
    if f.type == FieldDescriptor.TYPE_MESSAGE:
        assert f.message_type is not None
        return {s.name: some_value(s, i) for i, s in enumerate(f.message_type.fields) if not s.is_repeated}
    return 7 + index  # the integers


def every_field_set(message_class: Any, **fields: Any) -> Message:
    """A ``message_class`` whose every shown field holds a value that is not its default."""
    values: dict[str, Any] = {}
    for index, f in enumerate(shown_fields(message_class.DESCRIPTOR)):
        value = some_value(f, index)
        values[f.name] = [value] if f.is_repeated else value
    return message_class(**values, **fields)


def derived(message: Message, previous: dict[str, Any] | None = None) -> dict[str, Any]:
    return derive_status(job(previous), READY, report_from_proto(message), now=T0).status  # type: ignore[arg-type]


def as_sent(message: Message) -> dict[str, Any]:
    """The shown fields in the proto's own JSON mapping (64-bit integers as numbers, not text)."""
    shown = {f.json_name for f in shown_fields(message.DESCRIPTOR)}
    as_json = MessageToDict(message, always_print_fields_with_no_presence=True)
    return {k: _numbers(v) for k, v in as_json.items() if k in shown}


def _numbers(value: Any) -> Any:
    if isinstance(value, list):
        return [_numbers(v) for v in value]
    if isinstance(value, dict):
        return {k: _numbers(v) for k, v in value.items()}
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return value


def extended_job_status() -> Any:
    """JobStatus as generated after adding one line to policy_group.proto: ``double replay_seconds``."""
    file = descriptor_pb2.FileDescriptorProto()
    pb.DESCRIPTOR.CopyToProto(file)
    status_type = next(m for m in file.message_type if m.name == "JobStatus")
    status_type.field.add(
        name="replay_seconds",
        json_name="replaySeconds",
        number=999,
        type=descriptor_pb2.FieldDescriptorProto.TYPE_DOUBLE,
        label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("rlkube.v1.JobStatus"))


def test_every_jobstatus_figure_not_reshaped_is_shown_in_status_progress_as_sent() -> None:
    message = every_field_set(pb.JobStatus, phase="Running", epoch=2, max_epochs=5)
    progress = derived(message)["progress"]
    assert as_sent(message), "JobStatus shows no figure as it is: this test would prove nothing"
    for name, value in as_sent(message).items():
        assert progress[name] == value, name
    assert progress["epoch"] == 2  # the figures the operator reshapes are there as before


def test_a_field_added_to_the_proto_shows_up_in_status_progress_and_in_the_crd_schema() -> None:
    extended = extended_job_status()
    progress = derived(extended(phase="Running", epoch=2, replay_seconds=12.5))["progress"]
    assert progress["replaySeconds"] == 12.5
    assert shown_schema(extended.DESCRIPTOR)["replaySeconds"]["type"] == "number"


def test_the_crd_lists_every_shown_figure_and_accepts_a_status_holding_them() -> None:
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    listed = schema["properties"]["progress"]["properties"]
    assert {f.json_name for f in shown_fields()} <= listed.keys()
    jsonschema.Draft4Validator(schema).validate(derived(every_field_set(pb.JobStatus, phase="Running")))


def test_a_shown_figure_never_takes_the_name_of_one_the_operator_computes() -> None:
    computed = {f.alias or name for name, f in Progress.model_fields.items()}
    assert not computed & {f.json_name for f in shown_fields()}


def test_the_figures_kept_out_of_progress_are_jobstatus_fields_and_stay_out() -> None:
    assert set(NOT_PROGRESS) <= set(pb.JobStatus.DESCRIPTOR.fields_by_name)
    message = pb.JobStatus(phase="Running", incarnation="abc", workers=[pb.WorkerStatus(worker_id="w")])
    progress = derived(message)["progress"]
    assert not {"incarnation", "workers", "phase", "phaseName", "finished", "message"} & progress.keys()


def test_a_status_with_shown_figures_reads_back_unchanged_so_a_refresh_patches_nothing() -> None:
    message = every_field_set(pb.JobStatus, phase="Running")
    first = derived(message)
    assert derived(message, previous=first) == first


def test_a_coordinator_that_predates_the_phase_enum_is_read_from_the_phase_name() -> None:
    from rlkube.contract import CoordinatorPhase

    assert report_from_proto(pb.JobStatus(phase_name="Running")).phase is CoordinatorPhase.RUNNING
    both = pb.JobStatus(phase="Complete", phase_name="Running")
    assert report_from_proto(both).phase is CoordinatorPhase.COMPLETE
    assert report_from_proto(pb.JobStatus(phase=42)).phase is CoordinatorPhase.STARTING  # a newer value


def test_the_failure_reason_travels_as_its_enum_and_a_newer_value_reads_as_training_failed() -> None:
    from rlkube.contract import EngineFailure

    named = report_from_proto(pb.JobStatus(phase="Failed", failure_reason="NonFiniteWeights", message="x"))
    assert named.failure_reason is EngineFailure.NON_FINITE_WEIGHTS
    assert report_from_proto(pb.JobStatus(phase="Failed", failure_reason=42)).failure_reason is (
        EngineFailure.TRAINING_FAILED
    )
    assert "failureReason" not in derived(pb.JobStatus(phase="Running", failure_reason=1))["progress"]
