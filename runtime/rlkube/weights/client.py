"""A WeightStore client: watch versions, read layouts, fetch byte ranges straight into a buffer.

I/O (gRPC). Constructing it does nothing; :meth:`WeightStoreClient.connect` opens the channel.
Every call carries a deadline. :meth:`fetch_into` checks every chunk (version, offset, order,
bounds, xxh3) before its bytes are copied, once, into the destination; any mismatch raises
:class:`IntegrityError` naming the version and offset.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import numpy as np

from rlkube._proto import policy_group_pb2 as pb
from rlkube.security.credential import Credential, process_credential
from rlkube.security.grpc_auth import open_channel
from rlkube.weight_key import WeightKey
from rlkube.weights.copies import checksum, copy_message_into_slot
from rlkube.weights.errors import FetchError, IntegrityError
from rlkube.weights.layout import WeightLayout
from rlkube.weights.wire import (
    CHANNEL_OPTIONS,
    FETCH_METHOD,
    LAYOUT_METHOD,
    WATCH_METHOD,
    decode_chunk,
)


@dataclass
class FetchResult:
    nbytes: int
    chunks: int
    #: The version's checksum from the commit chunk of a ``while_packing`` fetch (else None).
    root: int | None = None


class WeightStoreClient:
    """One channel to one WeightStore (a train rank)."""

    def __init__(
        self,
        address: str,
        *,
        rpc_timeout: float = 30.0,
        bytes_per_second_floor: float = 50e6,
        credential: Credential | None = None,
    ) -> None:
        self.address = address
        #: Presented on every call (default: this process's, from the env contract).
        self.credential = credential if credential is not None else process_credential()
        self.rpc_timeout = rpc_timeout
        # A fetch's deadline grows with its size: rpc_timeout + nbytes / floor.
        self.bytes_per_second_floor = bytes_per_second_floor
        self._channel: grpc.Channel | None = None

    def connect(self) -> WeightStoreClient:
        if self._channel is None:
            self._channel = open_channel(self.address, self.credential, options=CHANNEL_OPTIONS)
            self._layout = self._channel.unary_unary(
                LAYOUT_METHOD,
                request_serializer=pb.GetLayoutRequest.SerializeToString,
                response_deserializer=pb.WeightLayout.FromString,
            )
            self._watch = self._channel.unary_stream(
                WATCH_METHOD,
                request_serializer=pb.WatchWeightsRequest.SerializeToString,
                response_deserializer=pb.WeightVersion.FromString,
            )
            self._fetch = self._channel.unary_stream(
                FETCH_METHOD,
                request_serializer=pb.FetchWeightsRequest.SerializeToString,
                response_deserializer=None,  # raw bytes: decoded by wire.decode_chunk without copying
            )
        return self

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    def __enter__(self) -> WeightStoreClient:
        return self.connect()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _error(self, what: str, exc: grpc.RpcError) -> FetchError:
        code = exc.code() if hasattr(exc, "code") else None
        details = exc.details() if hasattr(exc, "details") else str(exc)
        err = FetchError(f"{what} from {self.address}: {getattr(code, 'name', code)}: {details}")
        err.code = code  # type: ignore[attr-defined]
        return err

    def get_layout(self, digest: str = "") -> WeightLayout:
        assert self._channel is not None, "connect() first"
        try:
            msg = self._layout(pb.GetLayoutRequest(layout_digest=digest), timeout=self.rpc_timeout)
        except grpc.RpcError as exc:
            raise self._error(f"GetLayout({digest or 'newest'})", exc) from exc
        layout = WeightLayout.from_proto(msg)  # recomputes and checks the digest
        if digest and layout.digest != digest:
            raise IntegrityError(f"asked for layout {digest}, {self.address} sent {layout.digest}")
        return layout

    def watch(
        self,
        *,
        after: WeightKey | None,
        worker_id: str = "",
        node_name: str = "",
        seconds: float = 75.0,
        while_packing: bool = False,
    ) -> Iterator[pb.WeightVersion]:
        """Versions newer than ``after`` until the server ends the stream (or ``seconds`` pass).

        ``while_packing``: also versions the trainer has only started packing (checksum 0),
        announced again with their checksum once committed; fetch those with ``fetch_into``,
        which then waits for each chunk and returns the root with the commit.
        """
        assert self._channel is not None, "connect() first"
        request = pb.WatchWeightsRequest(
            worker_id=worker_id,
            node_name=node_name,
            after_version=after.version if after else 0,
            incarnation=after.incarnation if after else "",
            while_packing=while_packing,
        )
        call = self._watch(request, timeout=seconds)
        try:
            yield from call
        except grpc.RpcError as exc:
            if exc.code() not in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED):
                raise self._error("WatchWeights", exc) from exc
        finally:
            call.cancel()

    def fetch_into(
        self,
        version: pb.WeightVersion,
        dst: np.ndarray,
        *,
        offset: int = 0,
        length: int | None = None,
        digests: dict[int, int] | None = None,
        while_packing: bool | None = None,
    ) -> FetchResult:
        """Fetch ``[offset, offset+length)`` of ``version`` into ``dst[offset:offset+length]`` (uint8).

        Chunks follow the version's checksum grid (``version.chunk_bytes``; ``offset`` must be on
        it). Each chunk is checked (version, order, size, xxh3) before its bytes are copied once;
        its verified digest goes to ``digests[offset]``, from which the caller checks the
        version's hash-list root without reading the bytes again.

        ``while_packing`` (default: when the version is announced with checksum 0, still being
        packed): chunks arrive as the trainer packs them, and the stream ends with the commit
        chunk, whose root is returned in ``FetchResult.root`` (required when the announcement
        has no checksum); a publish that fails mid-pack ends the fetch with a FetchError
        (ABORTED), never with a result.
        """
        if while_packing is None:
            while_packing = version.checksum == 0
        assert self._channel is not None, "connect() first"
        grid = version.chunk_bytes
        end = version.total_bytes if length is None else offset + length
        if not (0 <= offset <= end <= version.total_bytes) or end > dst.shape[0]:
            raise ValueError(f"range [{offset}, {end}) does not fit version {version.version} / the buffer")
        if grid <= 0 or offset % grid:
            raise ValueError(
                f"offset {offset} is not on version {version.version}'s chunk grid ({grid} bytes)"
            )
        request = pb.FetchWeightsRequest(
            version=version.version,
            layout_digest=version.layout_digest,
            offset=offset,
            length=end - offset,
            chunk_bytes=grid,
            incarnation=version.incarnation,
            while_packing=while_packing,
        )
        where = f"version {version.incarnation}/{version.version} from {self.address}"
        expected = offset
        chunks = 0
        root: int | None = None
        call = self._fetch(request, timeout=self.rpc_timeout + (end - offset) / self.bytes_per_second_floor)
        try:
            for message in call:
                chunk = decode_chunk(message)
                n = len(chunk.data)
                if chunk.version != version.version:
                    raise IntegrityError(f"{where}: received a chunk of version {chunk.version}")
                if root is not None:
                    raise IntegrityError(f"{where}: a chunk at offset {chunk.offset} after the commit")
                if while_packing and n == 0 and chunk.offset == end == expected:
                    root = chunk.checksum  # the commit chunk
                    continue
                if chunk.offset != expected:
                    raise IntegrityError(
                        f"{where}: chunk at offset {chunk.offset}, expected offset {expected}"
                    )
                if n != min(grid, version.total_bytes - expected) or expected + n > end:
                    raise IntegrityError(
                        f"{where}: chunk at offset {chunk.offset} has {n} bytes; the grid is {grid} "
                        f"and the range ends at {end}"
                    )
                if checksum(chunk.data) != chunk.checksum:
                    raise IntegrityError(
                        f"{where}: chunk at offset {chunk.offset} ({n} bytes) fails its checksum"
                    )
                copy_message_into_slot(dst[expected : expected + n], chunk.data)
                if digests is not None:
                    digests[expected] = chunk.checksum
                expected += n
                chunks += 1
        except grpc.RpcError as exc:
            raise self._error(f"FetchWeights({where})", exc) from exc
        finally:
            call.cancel()
        if expected != end:
            raise IntegrityError(f"{where}: truncated: received {expected - offset} of {end - offset} bytes")
        if while_packing and root is None and not version.checksum:
            raise IntegrityError(f"{where}: the stream ended without the version's commit")
        if root is not None and version.checksum and root != version.checksum:
            raise IntegrityError(
                f"{where}: committed with checksum {root:016x}, announced {version.checksum:016x}"
            )
        return FetchResult(end - offset, chunks, root)
