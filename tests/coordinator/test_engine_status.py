"""What the engine on rank 0 reports reaches GetStatus field for field, and only what it gives changes."""

from __future__ import annotations

from dataclasses import fields

from rlkube._proto import policy_group_pb2 as pb
from rlkube.contract import CoordinatorPhase, EngineFailure
from rlkube.coordinator.service import job_status
from rlkube.coordinator.state import Coordinator, EngineStatus
from rlkube.spec import parse_job

from tests.conftest import MINIMAL_JOB


def test_every_engine_status_field_is_the_jobstatus_field_of_the_same_name() -> None:
    assert {f.name for f in fields(EngineStatus)} <= set(pb.JobStatus.DESCRIPTOR.fields_by_name)


def test_each_figure_the_engine_reports_is_answered_by_getstatus() -> None:
    coordinator = Coordinator(parse_job(MINIMAL_JOB), world_size=3)
    coordinator.update(
        EngineStatus(
            phase=CoordinatorPhase.RUNNING,
            epoch=4,
            max_epochs=9,
            env_steps=800,
            last_return=12.5,
            episodes=30,
            eval_return=20.0,
            fingerprints_consistent=False,
            last_sync_time=1234.5,
            message="training",
            finished=False,
            train_ranks=3,
        )
    )
    status = job_status(coordinator)
    assert status.phase == pb.JobStatus.Running
    assert status.phase_name == "Running"  # for operators that predate JobStatus.phase
    assert (status.epoch, status.max_epochs, status.env_steps, status.episodes) == (4, 9, 800, 30)
    assert (status.last_return, status.eval_return, status.last_sync_time) == (12.5, 20.0, 1234.5)
    assert (status.message, status.finished, status.fingerprints_consistent, status.train_ranks) == (
        "training",
        False,
        False,
        3,
    )


def test_an_update_changes_the_fields_it_gives_and_keeps_the_others() -> None:
    coordinator = Coordinator(parse_job(MINIMAL_JOB))
    coordinator.update(EngineStatus(phase=CoordinatorPhase.RUNNING, epoch=2, last_return=3.0))
    coordinator.update(EngineStatus(epoch=3, message="waiting for eval workers"))
    status = job_status(coordinator)
    assert (status.phase, status.epoch, status.last_return) == (pb.JobStatus.Running, 3, 3.0)
    assert status.message == "waiting for eval workers"


def test_before_any_report_the_coordinator_says_starting_with_no_returns() -> None:
    status = job_status(Coordinator(parse_job(MINIMAL_JOB)))
    assert status.phase == pb.JobStatus.Starting
    assert not status.HasField("last_return")
    assert not status.HasField("eval_return")
    assert status.fingerprints_consistent


def test_finish_answers_the_phase_and_message_it_is_given() -> None:
    coordinator = Coordinator(parse_job(MINIMAL_JOB))
    coordinator.finish(phase=CoordinatorPhase.FAILED, message="policy raised")
    status = job_status(coordinator)
    assert (status.phase, status.finished, status.message) == (pb.JobStatus.Failed, True, "policy raised")


def test_a_failure_names_its_reason_on_the_wire_training_failed_unless_given() -> None:
    coordinator = Coordinator(parse_job(MINIMAL_JOB))
    coordinator.finish(phase=CoordinatorPhase.FAILED, message="policy raised")
    assert job_status(coordinator).failure_reason == pb.JobStatus.TrainingFailed
    named = Coordinator(parse_job(MINIMAL_JOB))
    named.finish(
        phase=CoordinatorPhase.FAILED, message="NaN", failure_reason=EngineFailure.NON_FINITE_WEIGHTS
    )
    assert job_status(named).failure_reason == pb.JobStatus.NonFiniteWeights


def test_the_python_engine_failures_and_the_proto_ones_name_the_same_values() -> None:
    assert [f.value for f in EngineFailure] == list(pb.JobStatus.EngineFailure.keys())


def test_the_python_phase_and_the_proto_phase_name_the_same_values() -> None:
    assert [p.value for p in CoordinatorPhase] == list(pb.JobStatus.Phase.keys())
