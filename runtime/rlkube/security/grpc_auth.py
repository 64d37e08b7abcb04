"""Every gRPC server the runtime starts and every channel it opens, with the job's credential.

I/O. :func:`make_server` (:func:`make_aio_server` for asyncio) installs the one server interceptor
(:class:`TokenInterceptor`) and :func:`listen` binds a port (TLS with client certificates when
the credential has TLS files, else plain TCP); :func:`open_channel` wraps a channel in the one
client interceptor (:class:`TokenAttacher`) that puts ``authorization: Bearer <token>`` on every
call. A call without the token, or with a wrong one, is answered ``UNAUTHENTICATED`` before its
request is deserialized (a refused 200 MB push is never parsed). The check is once per call, not
per message, so a weight stream pays it once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, Sequence
from concurrent import futures
from typing import Any

import grpc
import grpc.aio

from rlkube.security.credential import METADATA_KEY, SCHEME, Credential

#: Answered to a call that carries no token / a wrong token.
MISSING_TOKEN = "this job's credential is required (authorization: Bearer <token>)"
WRONG_TOKEN = "the credential presented is not this job's"


def presented_token(metadata: Sequence[tuple[str, str | bytes]] | None) -> str | None:
    """The token a call's metadata presents ('' for another scheme), or None: none presented."""
    for key, value in metadata or ():
        if key == METADATA_KEY:
            text = value.decode(errors="replace") if isinstance(value, bytes) else value
            return text[len(SCHEME) :] if text.startswith(SCHEME) else ""
    return None


def _refusal(handler: grpc.RpcMethodHandler, detail: str) -> grpc.RpcMethodHandler:
    """A handler of ``handler``'s kind that answers UNAUTHENTICATED without reading the request."""

    def unary(request: Any, context: grpc.ServicerContext) -> Any:
        context.abort(grpc.StatusCode.UNAUTHENTICATED, detail)

    def stream(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        context.abort(grpc.StatusCode.UNAUTHENTICATED, detail)
        yield  # pragma: no cover - abort raises

    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(stream)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(unary)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(stream)
    return grpc.unary_unary_rpc_method_handler(unary)


class TokenInterceptor(grpc.ServerInterceptor):
    """The one server-side check: every call presents a token the credential accepts."""

    def __init__(self, credential: Credential) -> None:
        self.credential = credential
        self.refused = 0

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        return self.checked(continuation(handler_call_details), handler_call_details)

    def checked(
        self, handler: grpc.RpcMethodHandler | None, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        """``handler`` if the call presents an accepted token, else one that refuses it."""
        if handler is None:
            return None
        presented = presented_token(handler_call_details.invocation_metadata)  # type: ignore[attr-defined]
        if presented is not None and self.credential.accepts(presented):
            return handler
        self.refused += 1
        return _refusal(handler, MISSING_TOKEN if presented is None else WRONG_TOKEN)


class AioTokenInterceptor(grpc.aio.ServerInterceptor):
    """:class:`TokenInterceptor` for a ``grpc.aio`` server (the same check)."""

    def __init__(self, credential: Credential) -> None:
        self.check = TokenInterceptor(credential)

    @property
    def refused(self) -> int:
        return self.check.refused

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        return self.check.checked(await continuation(handler_call_details), handler_call_details)


class _WithToken:
    """A multicallable that adds the token to the call's metadata, then calls the real one."""

    def __init__(self, inner: Any, attacher: TokenAttacher) -> None:
        self._inner = inner
        self._attacher = attacher

    def __call__(self, request: Any, *args: Any, metadata: Any = None, **kwargs: Any) -> Any:
        return self._inner(request, *args, metadata=self._attacher.metadata(metadata), **kwargs)

    def with_call(self, request: Any, *args: Any, metadata: Any = None, **kwargs: Any) -> Any:
        return self._inner.with_call(request, *args, metadata=self._attacher.metadata(metadata), **kwargs)

    def future(self, request: Any, *args: Any, metadata: Any = None, **kwargs: Any) -> Any:
        return self._inner.future(request, *args, metadata=self._attacher.metadata(metadata), **kwargs)


class TokenAttacher(grpc.Channel):
    """The one client-side hook: a channel whose every call carries the credential's current token.

    It wraps each multicallable once (when a stub is built), so a call pays one tuple and one
    Python call, not grpc's generic interceptor machinery (measured: ``rlkube bench auth``).
    """

    def __init__(self, channel: grpc.Channel, credential: Credential) -> None:
        self._channel = channel
        self.credential = credential

    def metadata(self, metadata: Any) -> tuple[tuple[str, str], ...]:
        own = ((METADATA_KEY, SCHEME + self.credential.token()),)
        if not metadata:
            return own
        return tuple(m for m in metadata if m[0] != METADATA_KEY) + own

    def unary_unary(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return _WithToken(self._channel.unary_unary(method, *args, **kwargs), self)

    def unary_stream(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return _WithToken(self._channel.unary_stream(method, *args, **kwargs), self)

    def stream_unary(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return _WithToken(self._channel.stream_unary(method, *args, **kwargs), self)

    def stream_stream(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return _WithToken(self._channel.stream_stream(method, *args, **kwargs), self)

    def subscribe(self, callback: Any, try_to_connect: bool = False) -> None:
        self._channel.subscribe(callback, try_to_connect)

    def unsubscribe(self, callback: Any) -> None:
        self._channel.unsubscribe(callback)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> TokenAttacher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def make_server(
    credential: Credential,
    *,
    max_workers: int,
    options: Sequence[tuple[str, Any]],
    thread_name_prefix: str,
) -> grpc.Server:
    """A gRPC server whose every call is checked by :class:`TokenInterceptor` (when enforced)."""
    interceptors = [TokenInterceptor(credential)] if credential.enforced else []
    return grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix=thread_name_prefix),
        options=list(options),
        interceptors=interceptors,
    )


def make_aio_server(
    credential: Credential, *, executor: futures.ThreadPoolExecutor, options: Sequence[tuple[str, Any]]
) -> grpc.aio.Server:
    """:func:`make_server` for asyncio (create it on its loop): ``async def`` handlers run on the
    loop, the others on ``executor``."""
    interceptors = [AioTokenInterceptor(credential)] if credential.enforced else []
    return grpc.aio.server(
        executor,
        options=list(options),
        interceptors=interceptors,
    )


def listen(server: grpc.Server | grpc.aio.Server, address: str, credential: Credential) -> int:
    """Bind ``address`` (mutual TLS when the credential has TLS files); the port, or OSError."""
    if credential.tls is not None:
        tls = credential.tls
        creds = grpc.ssl_server_credentials(
            [(tls.key, tls.certificate)], root_certificates=tls.ca, require_client_auth=True
        )
        port = server.add_secure_port(address, creds)
    else:
        port = server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"cannot listen on {address}")
    return port


def open_channel(
    address: str, credential: Credential, *, options: Sequence[tuple[str, Any]] = ()
) -> grpc.Channel:
    """A channel to ``address`` that presents the credential on every call (TLS when configured)."""
    if credential.tls is not None:
        tls = credential.tls
        creds = grpc.ssl_channel_credentials(
            root_certificates=tls.ca, private_key=tls.key, certificate_chain=tls.certificate
        )
        channel = grpc.secure_channel(address, creds, options=list(options))
    else:
        channel = grpc.insecure_channel(address, options=list(options))
    if not credential.enforced:
        return channel
    return TokenAttacher(channel, credential)
