"""Every figure the coordinator's JobStatus carries reaches ``kubectl get rlj -o yaml``, with no field list.

The real kopf operator and kubectl against a real kube-apiserver, a fake coordinator answering
GetStatus. The figures are chosen from the proto descriptor, so a field added to JobStatus is
covered by this test without editing it (tests/status/test_progress_follows_the_proto.py adds
one at test time).
"""

from __future__ import annotations

from typing import Any

import yaml
from rlkube._proto import policy_group_pb2 as pb
from rlkube_devcluster.coordinators import FakeCoordinators
from rlkube_devcluster.operator_process import OperatorProcess
from rlkube_devcluster.waiting import wait_for

from tests.operator.conftest import Kubectl
from tests.operator.manifests import job_document
from tests.status.test_progress_follows_the_proto import as_sent, every_field_set


def test_every_shown_jobstatus_field_appears_in_kubectl_get_rlj_yaml(
    k: Kubectl, operator: OperatorProcess, coordinators: FakeCoordinators
) -> None:
    message = every_field_set(pb.JobStatus, phase="Running", epoch=2, max_epochs=5, weight_version=2)
    sent = as_sent(message)
    assert sent, "JobStatus shows no figure as it is: this test would prove nothing"
    fields = {f.name: list(v) if f.is_repeated else v for f, v in message.ListFields()}
    coordinators.report(k.namespace, "figures", **fields)
    k.apply(job_document("figures"))

    def progress() -> dict[str, Any] | None:
        job = yaml.safe_load(k("get", "rlj", "figures", "-o", "yaml").stdout)
        shown = job.get("status", {}).get("progress", {})
        return shown if shown.get("epoch") == 2 else None

    shown = wait_for(progress, timeout=120, what="status.progress of rlj/figures")
    for name, value in sent.items():
        assert shown.get(name) == value, name
    assert shown["weightVersion"] == 2
