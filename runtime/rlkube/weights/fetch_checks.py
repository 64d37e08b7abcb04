"""The receiver's checks of one fetched range, whatever transport carried it.

Pure (xxh3 over bytes it is handed). :class:`RangeChecks` is fed each chunk's head before its
bytes are placed (version, order, size, bounds: a chunk is refused before it can touch the
destination), then its bytes' digest, then the commit of a ``while_packing`` range; any
mismatch raises :class:`IntegrityError` naming the version, the source and the offset.
:meth:`RangeChecks.result` checks the range is whole and its root agrees with the announcement.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlkube.weights.copies import checksum
from rlkube.weights.errors import IntegrityError
from rlkube.weights.version import WeightVersion


@dataclass
class FetchResult:
    nbytes: int
    chunks: int
    #: The version's checksum from the commit of a ``while_packing`` fetch (else None).
    root: int | None = None


class RangeChecks:
    """The checks of ``[offset, end)`` of ``version``; verified digests go to ``digests[offset]``."""

    def __init__(
        self,
        version: WeightVersion,
        *,
        offset: int,
        end: int,
        while_packing: bool,
        where: str,
        digests: dict[int, int] | None = None,
    ) -> None:
        self.version = version
        self.start = offset
        self.end = end
        self.while_packing = while_packing
        self.where = where
        self.digests = digests
        self.expected = offset
        self.chunks = 0
        self.root: int | None = None

    def is_commit(self, offset: int, nbytes: int) -> bool:
        """Whether a chunk head is the commit of a ``while_packing`` range (no data, at its end)."""
        return self.while_packing and nbytes == 0 and offset == self.end == self.expected

    def head(self, version: int, offset: int, nbytes: int) -> None:
        """Check a data chunk's head before its bytes are placed at ``offset``."""
        where, grid = self.where, self.version.chunk_bytes
        if version != self.version.version:
            raise IntegrityError(f"{where}: received a chunk of version {version}")
        if self.root is not None:
            raise IntegrityError(f"{where}: a chunk at offset {offset} after the commit")
        if offset != self.expected:
            raise IntegrityError(f"{where}: chunk at offset {offset}, expected offset {self.expected}")
        if nbytes != min(grid, self.version.total_bytes - offset) or offset + nbytes > self.end:
            raise IntegrityError(
                f"{where}: chunk at offset {offset} has {nbytes} bytes; the grid is {grid} "
                f"and the range ends at {self.end}"
            )

    def verify(self, data: memoryview | bytes, digest: int) -> None:
        """Check the bytes of the chunk whose head was just checked against its ``digest``, and count it."""
        if checksum(data) != digest:
            raise IntegrityError(
                f"{self.where}: chunk at offset {self.expected} ({len(data)} bytes) fails its checksum"
            )
        if self.digests is not None:
            self.digests[self.expected] = digest
        self.expected += len(data)
        self.chunks += 1

    def commit(self, version: int, offset: int, root: int) -> None:
        """The commit that ends a ``while_packing`` range: its root, once every chunk arrived."""
        if version != self.version.version:
            raise IntegrityError(f"{self.where}: received a commit of version {version}")
        if self.root is not None or not self.is_commit(offset, 0):
            raise IntegrityError(
                f"{self.where}: a commit at offset {offset} after {self.expected - self.start} of "
                f"{self.end - self.start} bytes"
            )
        self.root = root

    def result(self) -> FetchResult:
        """The range is whole, and its commit (if any) agrees with the announcement."""
        where = self.where
        if self.expected != self.end:
            raise IntegrityError(
                f"{where}: truncated: received {self.expected - self.start} of {self.end - self.start} bytes"
            )
        if self.while_packing and self.root is None and not self.version.checksum:
            raise IntegrityError(f"{where}: the stream ended without the version's commit")
        if self.root is not None and self.version.checksum and self.root != self.version.checksum:
            raise IntegrityError(
                f"{where}: committed with checksum {self.root:016x}, announced {self.version.checksum:016x}"
            )
        return FetchResult(self.end - self.start, self.chunks, self.root)
