"""RLightning's ``rlightning.policy.utils.router``: which eval policy serves which request.

Pure and thread-safe, no Ray. On rlkube, eval replicas take whole fragments by lease from the
coordinator, so the framework itself routes nothing per request; these routers are for code that
drives several local eval policies itself, with RLightning's names and signatures:

* async: ``assign(current_loads, num_tasks, env_ids=None) -> [policy index per task]``;
  :class:`SimpleRouter` fills the least-loaded policy first, :class:`NodeAffinityRouter` prefers
  the least-loaded policy on the node that runs the request's env worker.
* sync: ``select_policy(env_id) -> policy``; :class:`SyncSimpleRouter` takes them in turn,
  :class:`SyncNodeAffinityRouter` takes them in turn among the policies of the env's node.

An env id names its env worker by its last ``-`` separated field (``"<replica>-<index>"`` on
rlkube, as in RLightning). A ``component_distribution`` maps a node id to
``{"env": {"ids": [...]}, "eval": {"ids": [...]}}``: which env workers and eval policies run there.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

logger = logging.getLogger(__name__)

ComponentDistribution = Mapping[str, Mapping[str, Mapping[str, Any]]]


def env_worker_index(env_id: str | None) -> int | None:
    """The env worker an env id belongs to (its last ``-`` field), or None when it names none."""
    if not isinstance(env_id, str):
        return None
    try:
        return int(env_id.rsplit("-", 1)[-1])
    except ValueError:
        return None


def _ids(components: Mapping[str, Mapping[str, Any]], role: str) -> list[int]:
    return [int(i) for i in components.get(role, {}).get("ids", [])]


class AsyncRouter(ABC):
    """Spreads a number of requests over policies given how many each already has in flight."""

    @abstractmethod
    def assign(
        self, current_loads: list[int], num_tasks: int, env_ids: Sequence[str] | None = None
    ) -> list[int]:
        """The policy index for each of ``num_tasks`` requests, in order."""


class SimpleRouter(AsyncRouter):
    """Each request goes to the policy with the fewest in flight (ties: the lower index)."""

    def assign(
        self, current_loads: list[int], num_tasks: int, env_ids: Sequence[str] | None = None
    ) -> list[int]:
        if not current_loads:
            raise ValueError("no eval policies to route requests to")
        heap = [(int(load), index) for index, load in enumerate(current_loads)]
        heapq.heapify(heap)
        chosen: list[int] = []
        for _ in range(num_tasks):
            load, index = heapq.heappop(heap)
            chosen.append(index)
            heapq.heappush(heap, (load + 1, index))
        return chosen


class NodeAffinityRouter(AsyncRouter):
    """Like :class:`SimpleRouter`, but among the policies on the node of each request's env worker."""

    def __init__(
        self, component_distribution: ComponentDistribution, policy_node_ids: list[str] | None = None
    ) -> None:
        self._env_worker_to_node = {
            worker: node for node, parts in component_distribution.items() for worker in _ids(parts, "env")
        }
        self._policy_node_ids = list(policy_node_ids or [])

    def assign(
        self, current_loads: list[int], num_tasks: int, env_ids: Sequence[str] | None = None
    ) -> list[int]:
        if not self._policy_node_ids or not env_ids:
            return SimpleRouter().assign(current_loads, num_tasks)
        if not current_loads:
            raise ValueError("no eval policies to route requests to")
        loads = [int(load) for load in current_loads]
        chosen: list[int] = []
        for task in range(num_tasks):
            env_id = env_ids[task] if task < len(env_ids) else None
            worker = env_worker_index(env_id)
            node = self._env_worker_to_node.get(worker) if worker is not None else None
            local = [i for i, n in enumerate(self._policy_node_ids) if n == node and i < len(loads)]
            index = min(local or range(len(loads)), key=lambda i: (loads[i], i))
            chosen.append(index)
            loads[index] += 1
        return chosen


class SyncRouter(ABC):
    """Picks the eval policy that serves one env's request."""

    @abstractmethod
    def select_policy(self, env_id: str | None = None) -> Any:
        """The policy for ``env_id``'s next request."""


class SyncSimpleRouter(SyncRouter):
    """The policies in turn (local policies are always idle between calls)."""

    def __init__(self, eval_policies: Sequence[Any]) -> None:
        if not eval_policies:
            raise ValueError("SyncSimpleRouter needs at least one eval policy")
        self._eval_policies = list(eval_policies)
        self._turn = itertools.cycle(self._eval_policies)
        self._lock = threading.Lock()

    def select_policy(self, env_id: str | None = None) -> Any:
        with self._lock:
            return next(self._turn)


class SyncNodeAffinityRouter(SyncRouter):
    """The policies of the env worker's node in turn; any policy in turn when the node is unknown."""

    def __init__(self, eval_policies: Sequence[Any], component_distribution: ComponentDistribution) -> None:
        if not eval_policies:
            raise ValueError("SyncNodeAffinityRouter needs at least one eval policy")
        self._eval_policies = list(eval_policies)
        self._env_worker_to_node: dict[int, str] = {}
        self._node_policies: dict[str, list[Any]] = {}
        for node, parts in component_distribution.items():
            env_workers, eval_ids = _ids(parts, "env"), _ids(parts, "eval")
            if bool(env_workers) != bool(eval_ids):
                raise ValueError(
                    f"node {node!r} runs {len(env_workers)} env workers and {len(eval_ids)} eval policies: "
                    "node affinity needs both on every node that has either"
                )
            for worker in env_workers:
                self._env_worker_to_node[worker] = node
            if eval_ids:
                self._node_policies[node] = [self._eval_policies[i] for i in eval_ids]
        self._node_turns = {node: itertools.cycle(policies) for node, policies in self._node_policies.items()}
        self._any_turn = itertools.cycle(self._eval_policies)
        self._lock = threading.Lock()
        logger.debug("env worker -> node: %s", self._env_worker_to_node)

    @property
    def num_nodes(self) -> int:
        return len(self._node_policies)

    def select_policy(self, env_id: str | None = None) -> Any:
        worker = env_worker_index(env_id)
        node = self._env_worker_to_node.get(worker) if worker is not None else None
        with self._lock:
            if node is not None and node in self._node_turns:
                return next(self._node_turns[node])
            return next(self._any_turn)


def create_router(
    rollout_mode: str,
    router_type: str,
    eval_policies: Sequence[Any],
    global_resource_manager: Any = None,
) -> SyncRouter | AsyncRouter:
    """RLightning's factory: a ``simple`` or ``node_affinity`` sync router, or an async SimpleRouter.

    ``global_resource_manager`` is anything with ``get_component_distribution()`` (needed for
    ``node_affinity``).
    """
    if rollout_mode == "async":
        return SimpleRouter()
    if rollout_mode != "sync":
        raise ValueError(f"rollout mode must be 'sync' or 'async', got {rollout_mode!r}")
    if router_type == "node_affinity":
        if global_resource_manager is None:
            raise ValueError("router_type 'node_affinity' needs a global_resource_manager")
        distribution = global_resource_manager.get_component_distribution()
        if not distribution:
            raise ValueError("router_type 'node_affinity' needs a non-empty component distribution")
        return SyncNodeAffinityRouter(eval_policies, distribution)
    if router_type != "simple":
        raise ValueError(f"router_type must be 'simple' or 'node_affinity', got {router_type!r}")
    return SyncSimpleRouter(eval_policies)
