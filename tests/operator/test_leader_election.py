"""Operator replicas elect one leader through a real coordination.k8s.io Lease, driven by kubectl.

Each replica authenticates with a client certificate of its own (bound to the ClusterRole of
rbac.RULES), so the API server's audit log tells whose writes are whose. A replica counts as
acting when it writes anything but the Lease (applies, status patches, events). The Lease lives
in the test's namespace (RLKUBE_OPERATOR_NAMESPACE), as the chart puts it in the release's.
"""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from rlkube_devcluster.coordinators import FakeCoordinators
from rlkube_devcluster.kubelet.node_agent import NodeAgent
from rlkube_devcluster.operator_process import OperatorProcess
from rlkube_devcluster.waiting import wait_for
from rlkube_operator.leadership import retry_period
from rlkube_operator.lease_election import micro_time

from tests.operator.conftest import Kubectl, start_operator
from tests.operator.manifests import job_document

if TYPE_CHECKING:
    from rlkube_devcluster.controlplane.cluster import ControlPlane

LEASE = "rlkube-operator"
#: What a user of the chart gets: RLKUBE_LEASE_DURATION's default.
DURATION = 10
#: A killed leader's Lease is taken DURATION after its last renewal; the rest is margin for a
#: loaded machine (the standby's next try, kopf starting its watchers, the apply itself).
TAKEOVER_SECONDS = 2 * DURATION
WRITES = ("create", "patch", "update", "delete")


@pytest.fixture
def replicas(
    operator_role: str, stand_in_node: NodeAgent, coordinators: FakeCoordinators
) -> Iterator[dict[str, OperatorProcess]]:
    """Operator replicas by name, started by the test (``start(name)``), all stopped at the end."""
    started: dict[str, OperatorProcess] = {}
    yield started
    for process in started.values():
        process.stop()


def start(
    replicas: dict[str, OperatorProcess],
    name: str,
    control_plane: ControlPlane,
    coordinators: FakeCoordinators,
    workdir: Path,
    k: Kubectl,
    *,
    env: dict[str, str] | None = None,
) -> str:
    """Start replica ``name``; return its identity in the Lease (as its log names it)."""
    replicas[name] = start_operator(
        control_plane,
        coordinators,
        workdir,
        name,
        env={
            "RLKUBE_LEADER_ELECTION_LEASE": LEASE,
            "RLKUBE_OPERATOR_NAMESPACE": k.namespace,
            "RLKUBE_FIELD_MANAGER": name,
            **(env or {}),
        },
    )
    return str(
        wait_for(
            lambda: (
                (found := re.search(r"rlkube operator (\S+): waiting to hold", replicas[name].log()))
                and found.group(1)
            ),
            what=f"{name} to name its identity",
        )
    )


def kill(process: OperatorProcess) -> None:
    """SIGKILL: no release of the Lease, the worst case for a takeover."""
    assert process.process is not None
    process.process.send_signal(signal.SIGKILL)
    process.process.wait(10)


def writes(control_plane: ControlPlane, user: str) -> int:
    """Requests of ``user`` that change anything besides the Lease."""
    return sum(
        1 for e in control_plane.audit() if e.user == user and e.verb in WRITES and e.resource != "leases"
    )


def lease(k: Kubectl) -> dict[str, Any]:
    return dict((k.get("lease", LEASE) or {}).get("spec") or {})


def leader_gauge(process: OperatorProcess) -> float:
    (line,) = [line for line in process.metrics().splitlines() if line.startswith("rlkube_operator_leader ")]
    return float(line.split()[1])


def applied(k: Kubectl, job: str) -> bool:
    return k.get("statefulset", f"{job}-train") is not None


#: The chart's two modes: the whole cluster, or listed namespaces (a glob here: tests' namespaces
#: are made per test); both elect through one Lease in the operator's namespace.
SCOPES = {"cluster": {}, "namespaces": {"RLKUBE_WATCH_NAMESPACES": "op*"}}


@pytest.mark.parametrize("scope", sorted(SCOPES))
def test_one_replica_acts_and_the_other_takes_over_when_it_is_killed(
    control_plane: ControlPlane,
    coordinators: FakeCoordinators,
    k: Kubectl,
    replicas: dict[str, OperatorProcess],
    workdir: Path,
    scope: str,
) -> None:
    a, b = f"op-a-{scope}", f"op-b-{scope}"
    first = start(replicas, a, control_plane, coordinators, workdir, k, env=SCOPES[scope])
    k.apply(job_document("first"))
    wait_for(lambda: applied(k, "first"), what="the first replica applies the first job")
    held = lease(k)
    assert (held["holderIdentity"], held["leaseDurationSeconds"], held["leaseTransitions"]) == (
        first,
        DURATION,
        0,
    )

    second = start(replicas, b, control_plane, coordinators, workdir, k, env=SCOPES[scope])
    wait_for(lambda: "standing by" in replicas[b].log(), what="the second replica to stand by")
    k.apply(job_document("second"))
    wait_for(lambda: applied(k, "second"), what="the acting replica applies the second job")
    wait_for(lambda: (k.get("rlj", "second") or {}).get("status"), what="status of the second job")
    assert writes(control_plane, a) > 0
    assert writes(control_plane, b) == 0, "the standby replica acted while the leader was alive"
    assert (leader_gauge(replicas[a]), leader_gauge(replicas[b])) == (1, 0)
    assert lease(k)["renewTime"] != held["renewTime"], "the leader does not renew its Lease"

    kill(replicas[a])
    killed = time.monotonic()
    k.apply(job_document("third"))
    wait_for(
        lambda: applied(k, "third"),
        timeout=TAKEOVER_SECONDS,
        interval=0.2,
        what=f"the standby takes over within {TAKEOVER_SECONDS}s of the leader's SIGKILL",
    )
    print(f"takeover after SIGKILL: {time.monotonic() - killed:.1f}s (Lease duration {DURATION}s)")
    taken = lease(k)
    assert (taken["holderIdentity"], taken["leaseTransitions"]) == (second, 1)
    assert writes(control_plane, b) > 0
    assert leader_gauge(replicas[b]) == 1
    # The new leader also reconciles what the old one left: the jobs it never saw are served.
    wait_for(lambda: (k.get("rlj", "third") or {}).get("status"), what="status of the third job")


def test_a_replica_started_later_waits_and_takes_over_at_once_from_a_leader_that_exits(
    control_plane: ControlPlane,
    coordinators: FakeCoordinators,
    k: Kubectl,
    replicas: dict[str, OperatorProcess],
    workdir: Path,
) -> None:
    """A rolling update: the new pod starts beside the acting one, waits, then replaces it."""
    start(replicas, "op-c", control_plane, coordinators, workdir, k)
    k.apply(job_document("before"))
    wait_for(lambda: applied(k, "before"), what="the old replica applies a job")
    new = start(replicas, "op-d", control_plane, coordinators, workdir, k)
    wait_for(lambda: "standing by" in replicas["op-d"].log(), what="the new replica to stand by")
    k("scale", "rlj/before", "--replicas=3")
    wait_for(
        lambda: (k.get("statefulset", "before-eval") or {}).get("spec", {}).get("replicas") == 3,
        what="the acting replica scales the job",
    )
    assert writes(control_plane, "op-d") == 0, "the new replica acted beside the old one"

    replicas["op-c"].stop()  # SIGTERM, as a rolling update sends it: the leader releases the Lease
    # Released, not left to run out: no holder, or already the new replica (never the old one).
    assert lease(k).get("holderIdentity") in (None, new)
    k.apply(job_document("after"))
    wait_for(lambda: applied(k, "after"), timeout=TAKEOVER_SECONDS, what="the new replica takes over")
    assert writes(control_plane, "op-d") > 0
    assert lease(k)["holderIdentity"] == new


def test_a_leader_that_finds_its_lease_taken_stops_at_once(
    control_plane: ControlPlane,
    coordinators: FakeCoordinators,
    k: Kubectl,
    replicas: dict[str, OperatorProcess],
    workdir: Path,
) -> None:
    """Fencing: whoever holds the Lease acts alone; a leader that lost it exits before its next write."""
    start(replicas, "op-e", control_plane, coordinators, workdir, k)
    k.apply(job_document("fenced"))
    wait_for(lambda: applied(k, "fenced"), what="the leader applies a job")
    # Another holder (a replica the leader cannot see, or an admin) takes the Lease.
    now = micro_time()
    k(
        "patch",
        "lease",
        LEASE,
        "--type=merge",
        "-p",
        '{"spec": {"holderIdentity": "someone-else", "leaseDurationSeconds": 3600,'
        f' "acquireTime": "{now}", "renewTime": "{now}"}}}}',
    )
    process = replicas["op-e"].process
    assert process is not None
    # It notices at its next renewal (every retry period) and exits 1, for its container to restart.
    assert process.wait(10 + 5 * retry_period(DURATION)) == 1
    assert "leadership lost" in replicas["op-e"].log()
    assert "someone-else" in replicas["op-e"].log()
    assert lease(k)["holderIdentity"] == "someone-else"
