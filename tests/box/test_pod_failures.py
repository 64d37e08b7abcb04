"""Jobs the pods refuse end ``Failed`` with the runtime's own reason and words, without burning backoff.

kubectl only, on the cluster-in-a-box (the real control plane, node agents running ``rlkube pod``
as processes, the real operator): the pod entrypoint writes a termination message, the kubelet puts it
in the pod's container status, the operator reads it. Fixing the spec starts the job.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from rlkube_devcluster.operator_process import OperatorProcess
from rlkube_devcluster.waiting import wait_for

from tests.box.conftest import Box, python_container, start_operator, statefulset
from tests.operator.conftest import Kubectl

#: A generous deadline: the pods import torch before they can refuse (about 6 s of CPU each), and
#: this machine may be loaded; the time from apply to Failed is printed (``pytest -s``), not asserted.
FAILED_WITHIN = 240.0
BACKOFF_LIMIT = 3

JOB: dict[str, Any] = {
    "apiVersion": "rlkube.io/v1alpha1",
    "kind": "RLJob",
    "metadata": {"name": "refused"},
    "spec": {
        "policy": {"type": "PPO", "modelCfg": {"hiddenSizes": [16]}},
        "env": {"id": "CartPole-v1", "numEnvs": 2},
        "train": {
            "maxEpochs": 500,
            "stepsPerEpoch": 128,
            "fragmentLength": 16,
            "batchSize": 64,
            "evalInterval": 0,
        },
        "trainer": {"replicas": 1},
        "evaluator": {"replicas": 1},
        "runPolicy": {"backoffLimit": BACKOFF_LIMIT},
    },
}


@pytest.fixture(scope="module")
def operator(box: Box) -> Iterator[OperatorProcess]:
    process = start_operator(box, "operator-failures.log")
    yield process
    process.stop()


def jsonpath(k: Kubectl, name: str, path: str) -> str:
    return str(k("get", "rlj", name, "-o", f"jsonpath={{{path}}}").stdout)


def failed_reason(k: Kubectl, name: str) -> str:
    return jsonpath(k, name, '.status.conditions[?(@.type=="Failed")].reason')


def job(name: str, **spec: Any) -> dict[str, Any]:
    document = copy.deepcopy(JOB)
    document["metadata"]["name"] = name
    for path, value in spec.items():
        node = document["spec"]
        *parents, last = path.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value
    return document


REFUSED = [
    ("ppo2", {"policy.type": "PPO2"}, "PolicyNotRegistered", "no policy named 'PPO2' is registered"),
    ("noenv", {"env.id": "CartPole-v9"}, "EnvNotFound", "'CartPole-v9'"),
    (
        "nockpt",
        {"engine": "eval", "checkpoint.path": "/var/lib/rlkube/missing/policy.pt"},
        "CheckpointNotFound",
        "/var/lib/rlkube/missing/policy.pt",
    ),
    ("replay", {"buffer.type": "replay"}, "BufferNotSupported", "PPO learns from rollout buffers only"),
]


@pytest.mark.parametrize(("name", "spec", "reason", "words"), REFUSED, ids=[r[2] for r in REFUSED])
def test_a_job_the_pods_refuse_fails_at_once_with_their_reason_and_message(
    k: Kubectl, operator: OperatorProcess, name: str, spec: dict[str, Any], reason: str, words: str
) -> None:
    applied = time.monotonic()
    k.apply(job(name, **spec))

    wait_for(
        lambda: failed_reason(k, name) == reason, timeout=FAILED_WITHIN, interval=0.5, what=f"{name} {reason}"
    )
    print(f"{name}: Failed/{reason} {time.monotonic() - applied:.1f} s after the apply")
    assert words in jsonpath(k, name, '.status.conditions[?(@.type=="Failed")].message')
    assert words in jsonpath(k, name, ".status.message")
    assert jsonpath(k, name, ".status.phase") == "Failed"
    assert int(jsonpath(k, name, ".status.train.restarts") or 0) < BACKOFF_LIMIT
    # cleanPodPolicy All: the pods go, what they said stays.
    wait_for(lambda: not json.loads(k("get", "pods", "-o", "json").stdout)["items"], what="the pods cleaned")
    assert jsonpath(k, name, ".status.lastFailure.reason") == reason
    assert words in jsonpath(k, name, ".status.lastFailure.message")


def test_fixing_the_spec_of_a_refused_job_starts_it(k: Kubectl, operator: OperatorProcess) -> None:
    k.apply(job("fixme", **{"policy.type": "PPO2"}))
    wait_for(lambda: failed_reason(k, "fixme") == "PolicyNotRegistered", timeout=FAILED_WITHIN, interval=0.5)

    k.apply(job("fixme"))

    wait_for(
        lambda: jsonpath(k, "fixme", ".status.phase") == "Running",
        timeout=240,
        interval=0.5,
        what="the fixed job Running",
    )
    generation = k.get("rlj", "fixme")["metadata"]["generation"]  # type: ignore[index]
    assert int(jsonpath(k, "fixme", ".status.observedGeneration")) == generation
    assert jsonpath(k, "fixme", '.status.conditions[?(@.type=="Failed")].status') == "False"


def test_the_kubelet_reports_what_a_container_wrote_to_its_termination_message_path(
    box: Box, k: Kubectl
) -> None:
    script = (
        "import os, sys; open(os.environ['RLKUBE_TERMINATION_MESSAGE_PATH'], 'w').write('said why'); "
        "print('a log line'); sys.exit(3)"
    )
    k.apply(statefulset("says", python_container(script)))
    terminated = wait_for(
        lambda: (
            (p := k.get("pod", "says-0"))
            and p["status"]["containerStatuses"][0].get("lastState", {}).get("terminated")
        ),
        what="a terminated container",
    )
    assert (terminated["exitCode"], terminated["message"]) == (3, "said why")


def test_with_fallback_to_logs_the_kubelet_reports_the_logs_tail_when_nothing_was_written(
    box: Box, k: Kubectl
) -> None:
    container = python_container("import sys; print('first'); print('the last words'); sys.exit(4)")
    container["terminationMessagePolicy"] = "FallbackToLogsOnError"
    k.apply(statefulset("tail", container))
    terminated = wait_for(
        lambda: (
            (p := k.get("pod", "tail-0"))
            and p["status"]["containerStatuses"][0].get("lastState", {}).get("terminated")
        ),
        what="a terminated container",
    )
    assert terminated["message"].endswith("the last words")
