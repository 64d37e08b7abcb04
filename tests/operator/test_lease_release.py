"""A clean stop leaves the Lease without a holder even when a renewal, still in flight from the
cancelled renewing task, wrote it between the release's read and its write (a 409)."""

from __future__ import annotations

import copy
from typing import Any

from rlkube_operator.kube import ApiError
from rlkube_operator.lease_election import LeaseElector


class OneLeaseApi:
    """One Lease object with optimistic concurrency; ``renew_before_next_write`` makes the next
    replace lose to a renewal by the same holder, as an in-flight one would."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.version = 0
        self.renew_before_next_write = 0

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.lease)

    def create(self, body: dict[str, Any]) -> dict[str, Any]:
        return self._store(body)

    def replace(self, body: dict[str, Any]) -> dict[str, Any]:
        assert self.lease is not None
        if self.renew_before_next_write:
            self.renew_before_next_write -= 1
            self.version += 1  # the renewal landed first
            self.lease["metadata"]["resourceVersion"] = str(self.version)
        if body["metadata"].get("resourceVersion") != self.lease["metadata"]["resourceVersion"]:
            raise ApiError(409, "Conflict", "the object has been modified")
        return self._store(body)

    def _store(self, body: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        self.lease = copy.deepcopy(body)
        self.lease["metadata"]["resourceVersion"] = str(self.version)
        return copy.deepcopy(self.lease)


def elector(api: OneLeaseApi) -> LeaseElector:
    return LeaseElector(
        api, namespace="rlkube-system", name="rlkube-operator", identity="op-a_1", duration_s=10
    )  # type: ignore[arg-type]


def test_a_release_that_loses_to_an_in_flight_renewal_reads_again_and_releases() -> None:
    api = OneLeaseApi()
    leader = elector(api)
    assert leader.try_once()
    api.renew_before_next_write = 1
    leader.release()
    assert api.lease is not None
    assert not api.lease["spec"].get("holderIdentity")


def test_a_release_gives_up_after_repeated_conflicts_and_leaves_the_lease_to_run_out() -> None:
    api = OneLeaseApi()
    leader = elector(api)
    assert leader.try_once()
    api.renew_before_next_write = 100
    leader.release()  # logged, not raised: the standby takes over when the duration runs out
    assert api.lease is not None
    assert api.lease["spec"]["holderIdentity"] == "op-a_1"
