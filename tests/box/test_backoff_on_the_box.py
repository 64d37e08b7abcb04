"""The operator fails the 4-rank job whose rank 1 always crashes after the same number of crashes
as ``rlkube run`` does (tests/run_policy/test_backoff_agrees.py): the real operator, the node
agents running the pods, the runtime's own crash.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from rlkube_devcluster.operator_process import OperatorProcess
from rlkube_devcluster.waiting import wait_for

from tests.box.conftest import Box, start_operator
from tests.operator.conftest import Kubectl
from tests.run_policy.jobs import CRASHES_TO_FAIL, crashing_job

pytestmark = pytest.mark.slow


def restarts_in(message: str) -> int:
    found = re.search(r"restarted (\d+) times", message)
    assert found, message
    return int(found.group(1))


@pytest.fixture(scope="module")
def operator(box: Box) -> Iterator[OperatorProcess]:
    process = start_operator(box, "operator-backoff.log")
    yield process
    process.stop()


def test_the_operator_fails_the_same_job_after_the_same_number_of_crashes(
    box: Box, k: Kubectl, operator: OperatorProcess
) -> None:
    k.apply(crashing_job("crashing"))
    k("wait", "--for=condition=Failed", "rlj/crashing", "--timeout=300s")
    job = k.get("rlj", "crashing")
    assert job is not None
    failed = next(c for c in job["status"]["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "BackoffLimitExceeded", failed
    assert restarts_in(failed["message"]) == CRASHES_TO_FAIL, failed
    assert job["status"]["train"]["restarts"] == CRASHES_TO_FAIL
    wait_for(lambda: (k.get("statefulset", "crashing-train") or {}).get("spec", {}).get("replicas") == 0)
