"""The weight plane: trained weights from train rank 0 to every EVAL policy, never torn.

Pure (no I/O): ``layout`` (state dict <-> flat buffer + manifest + digest), ``version`` (a
published version, the one in-memory type for ``pb.WeightVersion``), ``shm_header``
(the buffer header's bytes), ``wire`` (gRPC limits and the hand-framed chunk), ``consistency``
(fingerprint checks and the coordinator's load tracker; it only waits on a condition).
I/O: ``locks`` (flock with deadlines), ``shm_files`` / ``shm`` / ``shm_reader`` (the two-slot
shared-memory buffer), ``service`` and ``client`` (the WeightStore gRPC service), ``publisher``
(train side), ``receiver`` (a node's elected fetcher), ``sources`` (BasePolicy's WeightSource
and the header watcher), ``plane`` (what an eval worker wires up per strategy). ``copies``
names every byte copy on the hot path; ``errors`` holds the error classes.

See docs/architecture-weights.md for the flow and the API the coordinator and eval worker use.
"""

from rlkube.weights.consistency import LoadTracker, WorkerLoad, verify_eval_weight_consistency
from rlkube.weights.errors import (
    FetchError,
    IntegrityError,
    ShmError,
    SlotBusyError,
    StaleVersionError,
    WeightPlaneError,
    WriterBusyError,
)
from rlkube.weights.plane import EvalPlaneConfig, EvalWeightPlane, NullPlane, ShmPlane
from rlkube.weights.publisher import PublisherConfig, WeightPublisher
from rlkube.weights.service import VersionBoard, weight_store_handler
from rlkube.weights.wire import MAX_MESSAGE_BYTES

__all__ = [
    "MAX_MESSAGE_BYTES",
    "EvalPlaneConfig",
    "EvalWeightPlane",
    "FetchError",
    "IntegrityError",
    "LoadTracker",
    "NullPlane",
    "PublisherConfig",
    "ShmError",
    "ShmPlane",
    "SlotBusyError",
    "StaleVersionError",
    "VersionBoard",
    "WeightPlaneError",
    "WeightPublisher",
    "WorkerLoad",
    "WriterBusyError",
    "verify_eval_weight_consistency",
    "weight_store_handler",
]
