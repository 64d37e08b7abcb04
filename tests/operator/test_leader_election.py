"""Two operator replicas, one acting: the real kopf peering on a real kube-apiserver, driven by kubectl.

Each replica authenticates with a client certificate of its own (bound to the ClusterRole of
rbac.RULES), so the API server's audit log tells whose writes are whose. A replica counts as
acting when it writes anything but its own keep-alive in the ClusterKopfPeering (applies, status
patches, events).
"""

from __future__ import annotations

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

from tests.operator.conftest import Kubectl, start_operator
from tests.operator.manifests import job_document

if TYPE_CHECKING:
    from rlkube_devcluster.controlplane.cluster import ControlPlane

PEERING = "rlkube-ha"
#: What a user of the chart gets: RLKUBE_PEERING_LIFETIME's default.
LIFETIME = 8
#: The issue's promise: a killed leader is replaced within this many seconds.
TAKEOVER_SECONDS = 15
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
    *,
    env: dict[str, str] | None = None,
) -> None:
    replicas[name] = start_operator(
        control_plane,
        coordinators,
        workdir,
        name,
        env={"RLKUBE_PEERING": PEERING, "RLKUBE_FIELD_MANAGER": name, **(env or {})},
    )


def kill(process: OperatorProcess) -> None:
    """SIGKILL: no goodbye in the peering object, the worst case for a takeover."""
    assert process.process is not None
    process.process.send_signal(signal.SIGKILL)
    process.process.wait(10)


def writes(control_plane: ControlPlane, user: str) -> int:
    """Requests of ``user`` that change anything besides its keep-alive."""
    return sum(
        1
        for e in control_plane.audit()
        if e.user == user and e.verb in WRITES and e.resource != "clusterkopfpeerings"
    )


def peers(k: Kubectl, name: str = PEERING) -> dict[str, Any]:
    peering = k.get("clusterkopfpeering", name) or {}
    return dict(peering.get("status") or {})


def applied(k: Kubectl, job: str) -> bool:
    return k.get("statefulset", f"{job}-train") is not None


#: The chart's two modes: the whole cluster, or listed namespaces (a glob here: tests' namespaces
#: are made per test); both elect through the one cluster-scoped peering object.
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
    peering = f"{PEERING}-{scope}"  # one peering object per test: no records left by another
    env = {**SCOPES[scope], "RLKUBE_PEERING": peering}
    k.apply({"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": peering}})
    a, b = f"op-a-{scope}", f"op-b-{scope}"
    start(replicas, a, control_plane, coordinators, workdir, env=env)
    k.apply(job_document("first"))
    wait_for(lambda: applied(k, "first"), what="the first replica applies the first job")

    start(replicas, b, control_plane, coordinators, workdir, env=env)
    wait_for(lambda: len(peers(k, peering)) == 2, what="both replicas in the peering object")
    k.apply(job_document("second"))
    wait_for(lambda: applied(k, "second"), what="the acting replica applies the second job")
    wait_for(lambda: (k.get("rlj", "second") or {}).get("status"), what="status of the second job")
    assert writes(control_plane, a) > 0
    assert writes(control_plane, b) == 0, "the standby replica acted while the leader was alive"

    kill(replicas[a])
    killed = time.monotonic()
    k.apply(job_document("third"))
    wait_for(
        lambda: applied(k, "third"),
        timeout=TAKEOVER_SECONDS,
        interval=0.2,
        what=f"the standby takes over within {TAKEOVER_SECONDS}s of the leader's SIGKILL",
    )
    print(f"takeover after SIGKILL: {time.monotonic() - killed:.1f}s (keep-alive lifetime {LIFETIME}s)")
    assert writes(control_plane, b) > 0
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
    k.apply({"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": PEERING}})
    start(replicas, "op-c", control_plane, coordinators, workdir)
    k.apply(job_document("before"))
    wait_for(lambda: applied(k, "before"), what="the old replica applies a job")
    start(replicas, "op-d", control_plane, coordinators, workdir)
    wait_for(lambda: "op-c" in str(peers(k)) or len(peers(k)) >= 2, what="both replicas peered")
    k("scale", "rlj/before", "--replicas=3")
    wait_for(
        lambda: (k.get("statefulset", "before-eval") or {}).get("spec", {}).get("replicas") == 3,
        what="the acting replica scales the job",
    )
    assert writes(control_plane, "op-d") == 0, "the new replica acted beside the old one"

    replicas["op-c"].stop()  # SIGTERM, as a rolling update sends it: kopf removes its record
    k.apply(job_document("after"))
    wait_for(lambda: applied(k, "after"), timeout=TAKEOVER_SECONDS, what="the new replica takes over")
    assert writes(control_plane, "op-d") > 0


def test_a_replica_started_later_has_the_lower_priority_whatever_its_tie_breaker() -> None:
    from rlkube_operator.startup import peering_priority

    first = peering_priority(1000.000, tie_breaker=0)
    assert peering_priority(1000.001, tie_breaker=999) < first
    assert peering_priority(1000.000, tie_breaker=1) != first


def test_without_a_peering_name_the_operator_runs_standalone_and_with_one_it_must_peer() -> None:
    import kopf
    from rlkube_operator.settings import load_settings
    from rlkube_operator.startup import configure_peering

    alone = kopf.OperatorSettings()
    configure_peering(alone, load_settings({}), started=1.0)
    assert alone.peering.standalone
    peered = kopf.OperatorSettings()
    configure_peering(peered, load_settings({"RLKUBE_PEERING": PEERING}), started=1.0)
    assert not peered.peering.standalone
    assert peered.peering.mandatory  # paused until it has seen the other replicas
    assert peered.peering.clusterwide  # one object, whichever namespaces are served
    assert (peered.peering.name, peered.peering.lifetime) == (PEERING, LIFETIME)
