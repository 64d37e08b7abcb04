"""Ask a job's coordinator how training goes: ``PolicyGroup.GetStatus`` with a deadline (I/O).

Returns :class:`rlkube_operator.status.CoordinatorReport` (no protobuf types leave this module),
or ``None`` when the coordinator does not answer within the deadline: a job whose rank 0 is
starting, restarting or gone is normal, not an operator error. The figures the report does not
name are copied generically (``progress_fields``).
"""

from __future__ import annotations

import math

import grpc
from rlkube._proto import policy_group_pb2 as pb
from rlkube._proto import policy_group_pb2_grpc as pb_grpc
from rlkube.contract import CoordinatorPhase, EngineFailure
from rlkube.security.credential import Credential
from rlkube.security.grpc_auth import open_channel

from rlkube_operator.progress_fields import shown_values
from rlkube_operator.status import CoordinatorReport, NodeReport


def report_from_proto(message: pb.JobStatus) -> CoordinatorReport:
    def number(value: float) -> float | None:
        return None if math.isnan(value) else value

    episodes = int(message.episodes)
    return CoordinatorReport(
        phase=phase_of(message),
        epoch=int(message.epoch),
        max_epochs=int(message.max_epochs),
        env_steps=int(message.env_steps),
        episodes=episodes,
        # proto3 has no "unset" double: a return means something only once an episode ended.
        last_return=number(message.last_return) if episodes else None,
        eval_return=number(message.eval_return) if message.eval_return else None,
        weight_version=int(message.weight_version),
        last_sync_time=float(message.last_sync_time),
        steps_per_second=float(message.steps_per_second),
        nodes=tuple(
            NodeReport(node_name=n.node_name, version=int(n.version), lag=int(n.lag), workers=int(n.workers))
            for n in message.nodes
        ),
        finished=bool(message.finished),
        message=message.message,
        failure_reason=failure_reason_of(message),
        fingerprints_consistent=bool(message.fingerprints_consistent) if message.workers else True,
        shown=shown_values(message),
    )


def phase_of(message: pb.JobStatus) -> CoordinatorPhase:
    """The coordinator's phase; from its name when a coordinator that predates ``JobStatus.phase``
    sent only that (a value this operator does not know counts as Starting)."""
    name = pb.JobStatus.Phase.Name(message.phase) if message.phase in pb.JobStatus.Phase.values() else ""
    if message.phase == pb.JobStatus.Starting and message.phase_name:
        name = message.phase_name
    try:
        return CoordinatorPhase(name)
    except ValueError:
        return CoordinatorPhase.STARTING


def failure_reason_of(message: pb.JobStatus) -> EngineFailure:
    """Why a failed coordinator failed (a value this operator does not know: TrainingFailed)."""
    known = pb.JobStatus.EngineFailure.values()
    return EngineFailure(
        pb.JobStatus.EngineFailure.Name(message.failure_reason)
        if message.failure_reason in known
        else EngineFailure.TRAINING_FAILED
    )


def get_status(target: str, *, timeout: float, token: str = "") -> CoordinatorReport | None:
    """One GetStatus call with the job's ``token``; ``None`` when unreachable or past the deadline.

    A job with ``spec.security.tlsSecretName`` is asked over plain TCP too: its coordinator then
    refuses, and the status says the coordinator is unreachable (see docs/operations.md, mTLS).
    """
    credential = Credential.of_token(token) if token else Credential.open()
    with open_channel(target, credential) as channel:
        stub = pb_grpc.PolicyGroupStub(channel)
        try:
            answer = stub.GetStatus(pb.GetStatusRequest(), timeout=timeout)
        except grpc.RpcError:
            return None
    return report_from_proto(answer)
