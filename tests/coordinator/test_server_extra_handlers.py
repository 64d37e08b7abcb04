"""Handlers served beside PolicyGroup on rank 0's (asyncio) server see their call as a blocking gRPC
server shows it: a stream whose client leaves is told so (``is_active``, ``add_callback``) and its
generator is closed; an abort reaches the client with its code and details."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from rlkube.coordinator.service import CoordinatorServer
from rlkube.coordinator.state import Coordinator
from rlkube.health import POD
from rlkube.security.credential import Credential, new_token
from rlkube.security.grpc_auth import open_channel

from tests.engine.jobs import tiny_job

DEADLINE = 30.0
SERVICE = "test.Ticks"


class Ticks:
    """A stream of ticks until its client leaves, and a call that refuses."""

    def __init__(self) -> None:
        self.waiting = threading.Event()  # past its ticks, waiting while its client is there
        self.told_gone = threading.Event()  # add_callback ran
        self.saw_inactive = threading.Event()  # is_active() turned False while it waited
        self.closed = threading.Event()  # the generator's finally ran

    def stream(self, request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        context.add_callback(self.told_gone.set)
        try:
            tick = 0
            while True:
                if tick >= 3:  # then wait, as a fetch waits for a chunk, while the client is there
                    self.waiting.set()
                    while context.is_active():
                        self.told_gone.wait(0.05)
                    self.saw_inactive.set()
                    return
                tick += 1
                yield b"tick"
        finally:
            self.closed.set()

    def refuse(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"no {request.decode()} here")
        raise AssertionError("unreachable")

    def handler(self) -> grpc.GenericRpcHandler:
        same = {"request_deserializer": bytes, "response_serializer": bytes}
        return grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "Stream": grpc.unary_stream_rpc_method_handler(self.stream, **same),
                "Refuse": grpc.unary_unary_rpc_method_handler(self.refuse, **same),
            },
        )


@pytest.fixture
def served() -> Iterator[tuple[Ticks, grpc.Channel]]:
    ticks = Ticks()
    credential = Credential(tokens=(new_token(),))
    server = CoordinatorServer(
        Coordinator(tiny_job(), world_size=1),
        address="127.0.0.1:0",
        extra_handlers=[ticks.handler(), POD.handler()],
        credential=credential,
    ).start()
    channel = open_channel(f"127.0.0.1:{server.port}", credential)
    try:
        yield ticks, channel
    finally:
        channel.close()
        server.stop(grace=0)


def call(channel: grpc.Channel, method: str, streaming: bool) -> Any:
    make = channel.unary_stream if streaming else channel.unary_unary
    return make(f"/{SERVICE}/{method}", request_serializer=bytes, response_deserializer=bytes)


def test_a_stream_whose_client_leaves_is_told_and_its_generator_closed(
    served: tuple[Ticks, grpc.Channel],
) -> None:
    ticks, channel = served
    stream = call(channel, "Stream", streaming=True)(b"", timeout=DEADLINE)
    assert [next(stream) for _ in range(3)] == [b"tick"] * 3
    assert ticks.waiting.wait(DEADLINE)
    stream.cancel()
    assert ticks.told_gone.wait(DEADLINE)
    assert ticks.saw_inactive.wait(DEADLINE)
    assert ticks.closed.wait(DEADLINE)


def test_an_abort_reaches_the_client_with_its_code_and_details(served: tuple[Ticks, grpc.Channel]) -> None:
    _, channel = served
    with pytest.raises(grpc.RpcError) as refused:
        call(channel, "Refuse", streaming=False)(b"layout", timeout=DEADLINE)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert refused.value.details() == "no layout here"


def test_a_health_check_of_an_unknown_service_is_answered_not_found(
    served: tuple[Ticks, grpc.Channel],
) -> None:
    _, channel = served
    with pytest.raises(grpc.RpcError) as answered:
        health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=DEADLINE
        )
    assert answered.value.code() == grpc.StatusCode.NOT_FOUND
