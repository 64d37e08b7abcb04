"""The weight data port: a version's bytes over a plain socket, straight from slot to slot.

I/O (sockets, threads). gRPC's Python API hands every received message over as a new ``bytes``
object, so each remote byte was copied once by gRPC and once more into the slot; here the
receiver ``recv_into``s each chunk straight into its scratch slot and the server writes each
chunk from the pinned slot with ``sendall`` of a memoryview: the kernel's copies and none in
Python (:mod:`rlkube.weights.copies`). The control plane stays on gRPC: receivers watch, read
layouts and learn this port (``WeightStore.GetDataPort``) there, and fall back to FetchWeights
when the port cannot be reached.

What a fetch is, and every refusal, comes from :func:`rlkube.weights.service.fetch_pieces`,
the one fetch logic of both transports; the checks on the receiving side are
:class:`rlkube.weights.fetch_checks.RangeChecks`, the same as over gRPC. Framing:
:mod:`rlkube.weights.data_wire`.

The edge (every connection is a stranger until its request proves otherwise):

* each request carries the job's token, checked like every gRPC call (constant time, every
  accepted line of the token file); a wrong or missing one is answered ``UNAUTHENTICATED``
  before the request is parsed and the connection is closed;
* with the job's certificates the port speaks mutual TLS (the peer must present a certificate
  signed by the job's CA), as the gRPC servers do;
* lengths are checked before anything is read (token, request), the request head must arrive
  within ``head_timeout`` and the next request within ``idle_timeout``;
* a receiver that stops reading is cut after ``send_timeout`` (its pin on the slot goes with it);
* at most ``max_connections`` at once; one more is told ``RESOURCE_EXHAUSTED`` and closed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import ssl
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
from google.protobuf.message import DecodeError

from rlkube._proto import policy_group_pb2 as pb
from rlkube.security.credential import Credential, TlsFiles, process_credential
from rlkube.security.grpc_auth import MISSING_TOKEN, WRONG_TOKEN
from rlkube.weights.copies import receive_socket_into_slot, recv_exactly_into, send_slot_to_socket
from rlkube.weights.data_wire import (
    FRAME_HEAD,
    MAX_ERROR_BYTES,
    REQUEST_HEAD,
    FrameKind,
    MalformedRequest,
    decode_frame,
    decode_request_head,
    encode_request,
    error_frame,
    frame,
    status_code,
)
from rlkube.weights.errors import FetchError, IntegrityError
from rlkube.weights.fetch_checks import RangeChecks
from rlkube.weights.service import FetchRefused, VersionBoard, fetch_pieces

logger = logging.getLogger(__name__)


def _tls_context(tls: TlsFiles, *, server: bool) -> ssl.SSLContext:
    """Mutual TLS with the job's files (the key only ever touches a private temporary file)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server else ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.verify_mode = ssl.CERT_REQUIRED
    context.load_verify_locations(cadata=tls.ca.decode())
    with tempfile.TemporaryDirectory(prefix="rlkube-tls-") as directory:
        chain, key = Path(directory) / "tls.crt", Path(directory) / "tls.key"
        for path, data in ((chain, tls.certificate), (key, tls.key)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as out:
                out.write(data)
        context.load_cert_chain(chain, key)
    return context


def _recv_exact(sock: socket.socket, n: int, *, deadline: float) -> bytes:
    """Exactly ``n`` bytes (small: heads, tokens, requests); ConnectionError on EOF, TimeoutError late."""
    buf = bytearray(n)
    recv_exactly_into(sock, memoryview(buf), deadline=deadline)
    return bytes(buf)


@dataclass(eq=False)
class _Connection:
    sock: socket.socket
    thread: threading.Thread | None = None


@dataclass
class DataPortStats:
    connections: int = 0  # accepted and served
    requests: int = 0
    unauthenticated: int = 0  # a missing or wrong token
    malformed: int = 0  # not our framing, over a limit, or a request that does not parse
    turned_away: int = 0  # over max_connections
    cut: int = 0  # timed out: a head that did not arrive, a receiver that stopped reading


class DataPortServer:
    """Serves ``board``'s versions on ``address`` ("host:port"; port 0 picks one); see the module."""

    def __init__(
        self,
        board: VersionBoard,
        address: str,
        *,
        credential: Credential | None = None,
        max_connections: int = 64,
        head_timeout: float = 10.0,
        idle_timeout: float = 120.0,
        send_timeout: float = 30.0,
    ) -> None:
        self.board = board
        self.credential = credential if credential is not None else process_credential()
        self.max_connections = max_connections
        self.head_timeout = head_timeout
        self.idle_timeout = idle_timeout
        self.send_timeout = send_timeout
        self.stats = DataPortStats()
        host, _, port = address.rpartition(":")
        self._bind = (host.strip("[]") or "0.0.0.0", int(port))
        tls = self.credential.tls
        self._tls = _tls_context(tls, server=True) if tls is not None else None
        self._listener: socket.socket | None = None
        self._closed = threading.Event()
        self._lock = threading.Lock()
        #: Every connection being served: its socket (the TLS one once wrapped) and its thread.
        self._connections: dict[int, _Connection] = {}
        self._accepting: threading.Thread | None = None
        self.port = 0

    @property
    def tls(self) -> bool:
        return self._tls is not None

    def start(self) -> DataPortServer:
        family = socket.AF_INET6 if ":" in self._bind[0] else socket.AF_INET
        self._listener = socket.create_server(self._bind, family=family, backlog=self.max_connections)
        self.port = self._listener.getsockname()[1]
        self._accepting = threading.Thread(target=self._accept, name="weight-data-accept", daemon=True)
        self._accepting.start()
        return self

    def describe(self) -> pb.DataPort:
        """What ``WeightStore.GetDataPort`` answers for this port."""
        return pb.DataPort(port=self.port, tls=self.tls)

    def close(self) -> None:
        """Stop accepting, end every connection (releasing its pins) and join their threads."""
        self._closed.set()
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
        self.board.wake()  # a fetch waiting for a chunk being packed checks that we are closing
        with self._lock:
            serving = list(self._connections.values())
        for connection in serving:
            with contextlib.suppress(OSError):
                connection.sock.shutdown(socket.SHUT_RDWR)
        for connection in serving:
            if connection.thread is not None:
                connection.thread.join(timeout=10.0)
        if self._accepting is not None:
            self._accepting.join(timeout=10.0)

    def __enter__(self) -> DataPortServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _active(self) -> bool:
        return not self._closed.is_set()

    def _accept(self) -> None:
        assert self._listener is not None
        while not self._closed.is_set():
            try:
                conn, peer = self._listener.accept()
            except OSError:  # closed
                return
            with self._lock:
                full = len(self._connections) >= self.max_connections
                if not full:
                    connection = _Connection(conn)
                    connection.thread = threading.Thread(
                        target=self._serve, args=(connection, peer), name="weight-data", daemon=True
                    )
                    self._connections[id(connection)] = connection
            if full:
                self.stats.turned_away += 1
                self._turn_away(conn)
                continue
            assert connection.thread is not None
            connection.thread.start()

    def _turn_away(self, conn: socket.socket) -> None:
        detail = f"this weight data port serves {self.max_connections} connections at most"
        with contextlib.suppress(OSError):
            if self._tls is None:  # a TLS client could not read a plain frame; it sees the close
                conn.settimeout(1.0)
                _refuse(conn, grpc.StatusCode.RESOURCE_EXHAUSTED, detail)
        conn.close()

    def _serve(self, connection: _Connection, peer: tuple[str, int]) -> None:
        conn = connection.sock
        where = f"tcp:{peer[0]}:{peer[1]}"
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._tls is not None:
                conn.settimeout(self.head_timeout)
                conn = connection.sock = self._tls.wrap_socket(conn, server_side=True)
            self.stats.connections += 1
            while self._active() and self._serve_one(conn, where):
                pass
        except OSError as exc:  # ssl.SSLError included
            if isinstance(exc, TimeoutError):
                self.stats.cut += 1
            logger.debug("weight data connection %s: %s", where, exc)
        finally:
            with contextlib.suppress(OSError):
                connection.sock.close()
            with self._lock:
                self._connections.pop(id(connection), None)

    def _serve_one(self, conn: socket.socket, peer: str) -> bool:
        """Answer one request; whether the connection may carry another."""
        try:
            head = decode_request_head(
                _recv_exact(conn, REQUEST_HEAD.size, deadline=time.monotonic() + self.idle_timeout)
            )
        except ConnectionError:  # the receiver closed its connection between requests
            return False
        except MalformedRequest as exc:
            self.stats.malformed += 1
            return _refuse(conn, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        deadline = time.monotonic() + self.head_timeout
        token = _recv_exact(conn, head.token_length, deadline=deadline)
        if self.credential.enforced and not self.credential.accepts(token.decode(errors="replace")):
            self.stats.unauthenticated += 1
            return _refuse(conn, grpc.StatusCode.UNAUTHENTICATED, MISSING_TOKEN if not token else WRONG_TOKEN)
        try:
            raw = _recv_exact(conn, head.request_length, deadline=deadline)
            request = pb.FetchWeightsRequest.FromString(raw)
        except DecodeError as exc:
            self.stats.malformed += 1
            return _refuse(conn, grpc.StatusCode.INVALID_ARGUMENT, f"a request that does not parse: {exc}")
        self.stats.requests += 1
        conn.settimeout(self.send_timeout)  # each sendall must finish within it (a reader that stalls)
        committed = False
        try:
            pieces = fetch_pieces(self.board, request, peer=peer, active=self._active)
            with contextlib.closing(pieces):
                for piece in pieces:
                    kind = FrameKind.COMMIT if piece.commit else FrameKind.DATA
                    conn.sendall(
                        frame(
                            kind,
                            version=piece.version,
                            offset=piece.offset,
                            length=len(piece.data),
                            checksum=piece.checksum,
                        )
                    )
                    if piece.commit:
                        committed = True
                    else:
                        send_slot_to_socket(conn, piece.data)
        except FetchRefused as exc:
            return _refuse(conn, exc.code, exc.details)
        if not committed:
            conn.sendall(frame(FrameKind.END, version=request.version))
        return True


#: What a refusal reads of what the client sent after it, before closing (see _refuse).
_DRAIN_BYTES = 1 << 20
_DRAIN_SECONDS = 1.0


def _refuse(conn: socket.socket, code: grpc.StatusCode, detail: str) -> bool:
    """Send an ERROR frame and close gracefully: what the client sent past the refused part is
    read and dropped first (bounded), as closing on unread bytes resets the connection, and a
    reset can destroy the error frame before the client reads it."""
    conn.sendall(error_frame(code, detail))
    with contextlib.suppress(OSError):
        conn.shutdown(socket.SHUT_WR)
        deadline = time.monotonic() + _DRAIN_SECONDS
        drained = 0
        while drained < _DRAIN_BYTES and time.monotonic() < deadline:
            conn.settimeout(max(0.01, deadline - time.monotonic()))
            got = conn.recv(64 << 10)
            if not got:
                break
            drained += len(got)
    return False


class DataPortUnreachable(Exception):
    """The data port could not be connected to (the caller fetches over gRPC instead)."""


class DataPortConnection:
    """A receiver's connection to one train rank's data port, kept open across fetches."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        credential: Credential,
        tls: bool,
        connect_timeout: float = 5.0,
    ) -> None:
        self.host = host
        self.port = port
        self.credential = credential
        self.connect_timeout = connect_timeout
        self._tls = _tls_context(credential.tls, server=False) if tls and credential.tls is not None else None
        if tls and self._tls is None:
            raise DataPortUnreachable(f"{self.address} speaks TLS and this process has no certificates")
        self._sock: socket.socket | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def _connect(self) -> socket.socket:
        try:
            sock = socket.create_connection((self.host, self.port), timeout=self.connect_timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._tls is not None:
                sock = self._tls.wrap_socket(sock, server_hostname=self.host)
        except OSError as exc:  # ssl.SSLError included
            what = f"cannot connect to the weight data port {self.address}: {exc}"
            raise DataPortUnreachable(what) from exc
        return sock

    def close(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
            self._sock = None

    def fetch_into(
        self, request: pb.FetchWeightsRequest, dst: memoryview, checks: RangeChecks, *, deadline: float
    ) -> None:
        """Fetch ``request``'s range straight into ``dst`` (the whole buffer), checked by ``checks``.

        Raises :class:`DataPortUnreachable` when no connection could be made (nothing was asked),
        :class:`FetchError` (with the gRPC ``code``) for a refusal or a broken connection, and
        :class:`IntegrityError` for bytes that fail the checks; any failure closes the connection.
        """
        message = encode_request(request.SerializeToString(), self.credential.token())
        reused = self._sock is not None
        try:
            try:
                self._exchange(message, dst, checks, deadline=deadline)
            except (ConnectionError, ssl.SSLError) as exc:
                if not (reused and checks.expected == checks.start and checks.root is None):
                    raise
                logger.debug("weight data connection to %s went away (%s); reconnecting", self.address, exc)
                self.close()  # a kept connection the server dropped meanwhile: one fresh try
                self._exchange(message, dst, checks, deadline=deadline)
        except DataPortUnreachable:
            raise
        except TimeoutError as exc:
            self.close()
            what = f"{checks.where} over {self.address}: {exc}"
            raise _fetch_error(grpc.StatusCode.DEADLINE_EXCEEDED, what) from exc
        except OSError as exc:  # ssl.SSLError included
            self.close()
            what = f"{checks.where} over {self.address}: {exc}"
            raise _fetch_error(grpc.StatusCode.UNAVAILABLE, what) from exc
        except BaseException:
            self.close()
            raise

    def _exchange(self, message: bytes, dst: memoryview, checks: RangeChecks, *, deadline: float) -> None:
        if self._sock is None:
            self._sock = self._connect()
        sock = self._sock
        sock.settimeout(max(0.001, deadline - time.monotonic()))
        sock.sendall(message)
        head = bytearray(FRAME_HEAD.size)
        while True:
            recv_exactly_into(sock, memoryview(head), deadline=deadline)
            try:
                got = decode_frame(bytes(head))
            except MalformedRequest as exc:
                raise IntegrityError(f"{checks.where} over {self.address}: {exc}") from None
            if got.kind is FrameKind.DATA:
                checks.head(got.version, got.offset, got.length)  # before a byte lands in the slot
                view = dst[got.offset : got.offset + got.length]
                receive_socket_into_slot(sock, view, deadline=deadline)
                checks.verify(view, got.checksum)
            elif got.kind is FrameKind.COMMIT:
                checks.commit(got.version, got.offset, got.checksum)
                return
            elif got.kind is FrameKind.END:
                return
            else:
                detail = _recv_exact(sock, min(got.length, MAX_ERROR_BYTES), deadline=deadline).decode(
                    errors="replace"
                )
                self.close()
                code = status_code(got.offset)
                raise _fetch_error(code, f"{checks.where} over {self.address}: {code.name}: {detail}")


def _fetch_error(code: grpc.StatusCode, message: str) -> FetchError:
    err = FetchError(message)
    err.code = code  # type: ignore[attr-defined]
    return err
