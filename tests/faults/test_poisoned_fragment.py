"""One poisoned fragment never takes a run down (issue #29).

An insider holding the job's credential (as any eval pod does) pushes CartPole fragments with
action 7 mid-run (epoch 3 of 12) into a DDP run of two train ranks: each push is refused with INVALID_ARGUMENT
naming the key, nothing of it is journalled or trained, the insider's pod is evicted after three,
and the run finishes every planned epoch with every acknowledged fragment trained exactly once.
A poisoned fragment already in the journal (acknowledged by a coordinator that predates the
check) is quarantined when rank 0 takes it back, and the run goes on the same way.
"""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest
import torch
from rlkube._proto import policy_group_pb2 as pb
from rlkube.coordinator.client import CoordinatorError, PolicyGroupClient
from rlkube.coordinator.journal import AckJournal
from rlkube.coordinator.refusals import EVICT_AFTER_REFUSALS
from rlkube.coordinator.wire import fragment_to_proto
from rlkube.data.fragment import Fragment
from rlkube.security.credential import Credential
from tensordict import TensorDict

from benchmarks.auth.run import cartpole_trajectories
from tests.runtime.cluster import LocalRun, write_job
from tests.runtime.slow_env import ENV_ID as SLOW_ENV

pytestmark = pytest.mark.slow

MAX_EPOCHS = 12
NUM_ENVS = 4  # SMALL_JOB's
STEPS = 16  # its fragmentLength
FRAGMENTS_PER_EPOCH = 256 // (NUM_ENVS * STEPS)  # its stepsPerEpoch / (numEnvs * fragmentLength)


def poisoned() -> TensorDict:
    """A fragment of the run's own schema (PPO's keys and dtypes) with action 7 in one step."""
    data = cartpole_trajectories(NUM_ENVS, STEPS, 4)
    data["value"] = torch.zeros(NUM_ENVS, STEPS)
    data["action"][2, 5] = 7
    return data


def start(tmp_path: Path, local_run: list[LocalRun], **env: object) -> LocalRun:
    run = LocalRun(
        write_job(
            tmp_path,
            train__maxEpochs=MAX_EPOCHS,
            trainer__replicas=2,
            evaluator__replicas=1,
            runPolicy__backoffLimit=0,
            **env,
        ),
        tmp_path / "run",
    )
    local_run.append(run)
    return run


def insider_of(run: LocalRun) -> PolicyGroupClient:
    cluster = run.cluster()
    return PolicyGroupClient(
        cluster["coordinator"], credential=Credential.from_file(Path(cluster["token_file"]))
    )


def test_an_insiders_poisoned_actions_are_refused_and_the_run_trains_every_planned_epoch(
    local_run: list[LocalRun], tmp_path: Path
) -> None:
    # The handshake that puts the attack mid-run however fast the machine: the one honest eval
    # worker takes its steps from a budget of two epochs' fragments (it works through its tasks
    # one by one, so exactly 8 arrive), then holds in the first step of epoch 3's first task until
    # the test releases it. Epoch 3's other tasks wait in the queue, for the insider alone.
    release = tmp_path / "release"
    run = start(
        tmp_path,
        local_run,
        env__id=SLOW_ENV,
        env__imports=["tests.runtime.slow_env"],
        env__kwargs={
            "step_budget": 2 * FRAGMENTS_PER_EPOCH * NUM_ENVS * STEPS,
            "budget_file": str(tmp_path / "steps-spent"),
            "release_file": str(release),
        },
    )
    held = run.wait_until(lambda s: s.epoch >= 2, timeout=300, what="epoch 2")
    assert held.epoch == 2
    refusals: list[str] = []
    with insider_of(run) as insider:
        request = pb.RegisterRequest(role="eval", pod_name="insider", node_name="node-0", num_envs=NUM_ENVS)
        worker_id = insider.register(request, retry_for=10).worker_id
        while len(refusals) < EVICT_AFTER_REFUSALS:
            task = insider.lease(worker_id, wait_seconds=5.0)
            assert task.kind == pb.Task.COLLECT, task
            message = fragment_to_proto(
                Fragment(poisoned()), task_id=task.task_id, worker_id=worker_id, epoch=task.epoch
            )
            with pytest.raises(CoordinatorError) as refused:
                insider.push(message, retry_for=0)
            assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
            refusals.append(str(refused.value))
        with pytest.raises(CoordinatorError) as evicted:
            insider.lease(worker_id, wait_seconds=0)
        assert evicted.value.code == grpc.StatusCode.NOT_FOUND
    status = run.status()
    assert status is not None
    assert (status.fragments_refused, status.workers_evicted) == (EVICT_AFTER_REFUSALS, 1)
    assert status.epoch == 2  # nothing was trained meanwhile
    release.touch()
    assert run.wait(timeout=600) == 0, run.output[1]

    assert all("action holds 1 values outside Discrete(2) [0, 1] (e.g. 7)" in r for r in refusals)
    summary = run.summary()
    assert summary["epochs"] == MAX_EPOCHS
    assert summary["fragments_trained"] == summary["fragments_acknowledged"]
    assert summary["fragments_acknowledged_total"] == summary["fragments_trained_total"]
    assert summary["fragments_refused"] == EVICT_AFTER_REFUSALS
    assert summary["workers_evicted"] == ["insider"]
    assert {r["worker"] for r in summary["refusals"]} == {"insider#2"}  # after the one eval pod
    stdout = run.output[0]
    assert f"{EVICT_AFTER_REFUSALS} fragments refused at the edge" in stdout
    assert "refused: insider#2 task e2-f" in stdout
    assert "evicted     eval pod insider" in stdout
    logs = run.run_dir / "logs"
    assert (logs / "small-train-1.log").read_text().count("==== small-train-1 started") == 1  # never died


def test_a_poisoned_fragment_in_the_journal_is_quarantined_and_the_run_trains_every_planned_epoch(
    local_run: list[LocalRun], tmp_path: Path
) -> None:
    # As a coordinator without the check would have left it: acknowledged in epoch 0, not yet trained.
    journal = AckJournal(tmp_path / "run" / "checkpoints" / "acknowledged", incarnation="older").open()
    journal.record(epoch=0, fragment=Fragment(poisoned()), key="e0-f1.secret", worker="small-eval-1#1")
    run = start(tmp_path, local_run)
    assert run.wait(timeout=600) == 0, run.output[1]

    summary = run.summary()
    assert summary["epochs"] == MAX_EPOCHS
    assert summary["fragments_quarantined"] == summary["fragments_quarantined_total"] == 1
    assert summary["fragments_acknowledged_total"] == (
        summary["fragments_trained_total"] + summary["fragments_quarantined_total"]
    )
    [record] = summary["refusals"]
    assert (record["worker"], record["task"], record["quarantined"]) == ("small-eval-1#1", "e0-f1", True)
    [note] = (tmp_path / "run" / "quarantine").glob("*.json")
    assert "action holds 1 values outside Discrete(2)" in json.loads(note.read_text())["reason"]
    assert "1 quarantined (in " in run.output[0]
