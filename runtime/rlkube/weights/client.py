"""A WeightStore client: watch versions, read layouts, fetch byte ranges straight into a buffer.

I/O (gRPC, and the rank's weight data port). Constructing it does nothing;
:meth:`WeightStoreClient.connect` opens the channel. Every call carries a deadline.
:meth:`fetch_into` fetches over the rank's weight data port when it has one
(:mod:`rlkube.weights.data_port`: each chunk received straight into the destination), else over
gRPC (each chunk copied once from its message), and falls back to gRPC when the port cannot be
reached. Either way every chunk is checked (version, offset, order, bounds before its bytes land,
xxh3; :class:`RangeChecks`); any mismatch raises :class:`IntegrityError` naming the version and offset.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import grpc
import numpy as np

from rlkube._proto import policy_group_pb2 as pb
from rlkube.metrics import series as metrics
from rlkube.security.credential import Credential, process_credential
from rlkube.security.grpc_auth import open_channel
from rlkube.weight_key import WeightKey
from rlkube.weights.copies import copy_message_into_slot
from rlkube.weights.data_port import DataPortConnection, DataPortUnreachable
from rlkube.weights.errors import FetchError, IntegrityError
from rlkube.weights.fetch_checks import FetchResult, RangeChecks
from rlkube.weights.layout import WeightLayout
from rlkube.weights.version import WeightVersion
from rlkube.weights.wire import (
    CHANNEL_OPTIONS,
    DATA_PORT_METHOD,
    FETCH_METHOD,
    LAYOUT_METHOD,
    WATCH_METHOD,
    decode_chunk,
)

logger = logging.getLogger(__name__)


#: How long a client fetches over gRPC after finding a rank's data port absent or unreachable.
DATA_PORT_RETRY_SECONDS = 30.0


class WeightStoreClient:
    """One channel to one WeightStore (a train rank)."""

    def __init__(
        self,
        address: str,
        *,
        rpc_timeout: float = 30.0,
        bytes_per_second_floor: float = 50e6,
        credential: Credential | None = None,
        use_data_port: bool = True,
    ) -> None:
        self.address = address
        #: Fetch over the rank's weight data port when it offers one (else every byte over gRPC).
        self.use_data_port = use_data_port
        self._data: DataPortConnection | None = None
        self._data_retry_at = 0.0
        #: Bytes this client fetched over the data port (the rest came over gRPC).
        self.fetched_over_data_port = 0
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
                response_deserializer=WeightVersion.decode,
            )
            self._fetch = self._channel.unary_stream(
                FETCH_METHOD,
                request_serializer=pb.FetchWeightsRequest.SerializeToString,
                response_deserializer=None,  # raw bytes: decoded by wire.decode_chunk without copying
            )
            self._data_port_rpc = self._channel.unary_unary(
                DATA_PORT_METHOD,
                request_serializer=pb.GetDataPortRequest.SerializeToString,
                response_deserializer=pb.DataPort.FromString,
            )
        return self

    def close(self) -> None:
        if self._data is not None:
            self._data.close()
            self._data = None
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
    ) -> Iterator[WeightVersion]:
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

    def data_port(self) -> DataPortConnection | None:
        """The rank's weight data port, when it has one this client may use (asked once over gRPC).

        None: this client fetches over gRPC (``use_data_port`` off, a rank serving gRPC only, an
        older rank without GetDataPort, a TLS mismatch, or a port found unreachable in the last
        :data:`DATA_PORT_RETRY_SECONDS`).
        """
        assert self._channel is not None, "connect() first"
        if self._data is not None or not self.use_data_port or time.monotonic() < self._data_retry_at:
            return self._data
        host, _, _ = self.address.rpartition(":")
        if not host or "/" in host:  # unix:// and other non-TCP targets have no data port
            self.use_data_port = False
            return None
        try:
            info = self._data_port_rpc(pb.GetDataPortRequest(), timeout=self.rpc_timeout)
        except grpc.RpcError as exc:
            if exc.code() is not grpc.StatusCode.UNIMPLEMENTED:
                raise self._error("GetDataPort", exc) from exc
            info = pb.DataPort()  # an older rank, or a store whose publisher is not serving yet
        if not info.port:
            self._data_retry_at = time.monotonic() + DATA_PORT_RETRY_SECONDS
            return None
        try:
            self._data = DataPortConnection(
                host.strip("[]"), info.port, credential=self.credential, tls=info.tls
            )
        except DataPortUnreachable as exc:
            self._data_unreachable(exc)
        return self._data

    def _data_unreachable(self, exc: DataPortUnreachable) -> None:
        logger.warning("%s; fetching from %s over gRPC", exc, self.address)
        metrics.DATA_PORT_FALLBACKS.inc()
        if self._data is not None:
            self._data.close()
            self._data = None
        self._data_retry_at = time.monotonic() + DATA_PORT_RETRY_SECONDS

    def fetch_into(
        self,
        version: WeightVersion,
        dst: np.ndarray,
        *,
        offset: int = 0,
        length: int | None = None,
        digests: dict[int, int] | None = None,
        while_packing: bool | None = None,
    ) -> FetchResult:
        """Fetch ``[offset, offset+length)`` of ``version`` into ``dst[offset:offset+length]`` (uint8).

        Over the rank's weight data port when it has one (each chunk received straight into
        ``dst``), else over gRPC (each chunk copied once from its message); the checks are the
        same (:class:`RangeChecks`). Chunks follow the version's checksum grid
        (``version.chunk_bytes``; ``offset`` must be on it). Each chunk is checked (version,
        order, size before its bytes land, then xxh3); its verified digest goes to
        ``digests[offset]``, from which the caller checks the version's hash-list root without
        reading the bytes again.

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
        checks = RangeChecks(
            version, offset=offset, end=end, while_packing=while_packing, where=where, digests=digests
        )
        timeout = self.rpc_timeout + (end - offset) / self.bytes_per_second_floor
        for _ in range(2):  # a port learnt earlier may be gone (the rank restarted): ask once more
            known = self._data is not None
            data_port = self.data_port()
            if data_port is None:
                break
            try:
                data_port.fetch_into(
                    request, memoryview(dst.data), checks, deadline=time.monotonic() + timeout
                )
                self.fetched_over_data_port += end - offset
                return checks.result()
            except DataPortUnreachable as exc:
                if not known:
                    self._data_unreachable(exc)
                    break
                data_port.close()
                self._data = None
        call = self._fetch(request, timeout=timeout)
        try:
            for message in call:
                chunk = decode_chunk(message)
                if checks.is_commit(chunk.offset, len(chunk.data)):
                    checks.commit(chunk.version, chunk.offset, chunk.checksum)
                    continue
                at = checks.expected
                checks.head(chunk.version, chunk.offset, len(chunk.data))
                checks.verify(chunk.data, chunk.checksum)
                copy_message_into_slot(dst[at : at + len(chunk.data)], chunk.data)
        except grpc.RpcError as exc:
            raise self._error(f"FetchWeights({where})", exc) from exc
        finally:
            call.cancel()
        return checks.result()
