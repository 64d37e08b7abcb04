"""Where train ranks may run: NCCL needs one GPU per rank on a node. Pure (no torch, no I/O).

NCCL refuses two ranks on one device (the ranks then fail at their first collective and restart
forever), so a job that puts more train ranks on one machine than it has GPUs is refused before
any process starts, with the change that fixes it:

* ``rlkube run`` and ``rlkube validate``: every train rank runs on this machine, which has
  ``torch.cuda.device_count()`` GPUs (``auto`` resolves to NCCL when it has any);
* a train pod (``rlkube pod``): one rank per pod, on the GPUs the pod sees (the backend is the one
  the operator resolved from the pod's ``nvidia.com/gpu`` limit); the spec rule that ``nccl``
  needs that limit (``spec.CROSS_FIELD_RULES``) is the same rule, checked at apply time.

Each train process uses GPU ``LOCAL_RANK`` of those it sees; the local launcher gives train rank
*i* its own GPU through ``CUDA_VISIBLE_DEVICES`` (:func:`visible_gpu_for_rank`), as Kubernetes'
device plugin gives each pod its own, so ``LOCAL_RANK`` is 0 everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlkube.spec import Backend, RLJobSpec


@dataclass(frozen=True)
class TrainPlacement:
    """How many train ranks share one machine's GPUs, and over which backend."""

    backend: Backend
    ranks_per_node: int
    gpus_per_node: int
    #: Where the ranks run, for the message: "on this machine", "in this train pod".
    where: str
    #: Why the backend is what it is, when the user did not name it ("auto: CUDA is present").
    resolved_because: str = ""

    @classmethod
    def local(cls, spec: RLJobSpec, *, gpus: int) -> TrainPlacement:
        """``rlkube run``: every train rank on this machine, which has ``gpus`` GPUs."""
        backend = spec.resolved_backend(cuda_available=gpus > 0)
        because = (
            "spec.trainer.backend is auto and CUDA is present" if spec.trainer.backend is Backend.AUTO else ""
        )
        return cls(backend, spec.trainer.replicas, gpus, "on this machine", because)


def placement_problems(placement: TrainPlacement) -> list[str]:
    """What is wrong with ``placement`` (empty when nothing), each line naming the change to make."""
    if placement.backend is not Backend.NCCL:
        return []
    ranks, gpus = placement.ranks_per_node, placement.gpus_per_node
    if ranks <= gpus:
        return []
    resolved = f" ({placement.resolved_because})" if placement.resolved_because else ""
    seen = (
        "no GPU is visible"
        if gpus == 0
        else f"only {gpus} GPU{'s' if gpus > 1 else ''} {'are' if gpus > 1 else 'is'} visible"
    )
    fix = (
        "set spec.trainer.backend to gloo (or give the pod spec.trainer.resources.limits['nvidia.com/gpu'])"
        if gpus == 0
        else f"run with --set spec.trainer.replicas={gpus}, or --set spec.trainer.backend=gloo "
        "(gloo lets ranks share a GPU)"
    )
    return [
        f"spec.trainer.replicas: {ranks} train rank{'s' if ranks > 1 else ''} {placement.where} use NCCL"
        f"{resolved}, which needs one GPU per rank, and {seen} (NCCL refuses two ranks on one GPU): {fix}"
    ]


def visible_gpu_for_rank(index: int, *, parent_visible: str | None, count: int) -> str | None:
    """``CUDA_VISIBLE_DEVICES`` for local train rank ``index``: its own GPU of those this machine shows.

    ``parent_visible`` is the launcher's own ``CUDA_VISIBLE_DEVICES`` (ids or UUIDs), ``count``
    its ``torch.cuda.device_count()``. None without GPUs. With more ranks than GPUs (gloo only,
    see :func:`placement_problems`) ranks share them round-robin.
    """
    if count <= 0:
        return None
    ids = [part.strip() for part in (parent_visible or "").split(",") if part.strip()][:count]
    if not ids:
        ids = [str(i) for i in range(count)]
    return ids[index % len(ids)]
