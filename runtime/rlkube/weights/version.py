"""A published weight version as the weight plane holds it: :class:`WeightVersion`.

Pure: no I/O. The one in-memory type for an announcement, from the publisher through the
:class:`~rlkube.weights.service.VersionBoard` and the WeightStore stream to a node's receiver;
``pb.WeightVersion`` exists only at the wire's edges (:meth:`WeightVersion.to_proto` where the
service sends, :meth:`WeightVersion.from_proto` where the client receives), as
:class:`~rlkube.weights.layout.WeightLayout` does for layouts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from rlkube._proto import policy_group_pb2 as pb
from rlkube.weight_key import WeightKey


@dataclass(frozen=True)
class WeightVersion:
    """One version of the trained weights, as announced (the fields of ``rlkube.v1.WeightVersion``)."""

    version: int
    incarnation: str
    layout_digest: str = ""
    total_bytes: int = 0
    #: Hash-list root over the ``chunk_bytes`` grid; 0: announced while still being packed.
    checksum: int = 0
    #: Unix seconds.
    published_at: float = 0.0
    #: host:port of every train rank serving it (Sharded).
    sources: tuple[str, ...] = ()
    #: Per-parameter L2 norms on the trainer.
    fingerprint: Mapping[str, float] = field(default_factory=dict)
    #: The checksum's grid; fetches use it as their chunk size.
    chunk_bytes: int = 0

    @property
    def key(self) -> WeightKey:
        return WeightKey(self.incarnation, self.version)

    def supersedes(self, after: WeightKey | None) -> bool:
        """Whether a holder of ``after`` should load this version (see :meth:`WeightKey.supersedes`)."""
        return self.key.supersedes(after)

    def to_proto(self) -> pb.WeightVersion:
        return pb.WeightVersion(
            version=self.version,
            layout_digest=self.layout_digest,
            total_bytes=self.total_bytes,
            checksum=self.checksum,
            incarnation=self.incarnation,
            published_at=self.published_at,
            sources=list(self.sources),
            fingerprint=dict(self.fingerprint),
            chunk_bytes=self.chunk_bytes,
        )

    @classmethod
    def from_proto(cls, msg: pb.WeightVersion) -> WeightVersion:
        return cls(
            version=int(msg.version),
            incarnation=msg.incarnation,
            layout_digest=msg.layout_digest,
            total_bytes=int(msg.total_bytes),
            checksum=int(msg.checksum),
            published_at=float(msg.published_at),
            sources=tuple(msg.sources),
            fingerprint=dict(msg.fingerprint),
            chunk_bytes=int(msg.chunk_bytes),
        )

    @classmethod
    def decode(cls, data: bytes) -> WeightVersion:
        """From the bytes of a ``rlkube.v1.WeightVersion`` (the WatchWeights stream's deserializer)."""
        return cls.from_proto(pb.WeightVersion.FromString(data))

    def encode(self) -> bytes:
        """The bytes of the ``rlkube.v1.WeightVersion`` (the WatchWeights stream's serializer)."""
        return bytes(self.to_proto().SerializeToString())
