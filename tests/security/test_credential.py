"""The job's credential: every server refuses calls without it, a rotated file is picked up, mTLS works."""

from __future__ import annotations

import subprocess
from pathlib import Path

import grpc
import pytest
from rlkube._proto import policy_group_pb2 as pb
from rlkube.security import credential as cred
from rlkube.security.credential import Credential, TlsFiles, new_token, write_token_file
from rlkube.security.grpc_auth import listen, make_server, open_channel
from rlkube.weights.client import WeightStoreClient
from rlkube.weights.errors import FetchError
from rlkube.weights.service import VersionBoard, serve_weight_store
from rlkube.weights.shm import ShmWriter

from tests.security.live import LiveJob, code_of


def test_the_weight_store_refuses_a_fetch_without_the_token_and_serves_one_with_it(tmp_path: Path) -> None:
    token = new_token()
    board = VersionBoard(ShmWriter(tmp_path / "shm"))
    server, port = serve_weight_store(board, "127.0.0.1:0", credential=Credential.of_token(token))
    try:
        codes = {}
        for name, credential in (("none", Credential.open()), ("job", Credential.of_token(token))):
            with WeightStoreClient(f"127.0.0.1:{port}", credential=credential) as client:
                with pytest.raises(FetchError) as refused:
                    client.get_layout()
                codes[name] = refused.value.code  # type: ignore[attr-defined]
    finally:
        server.stop(0)
    # With the token the call reaches the service, which has no version yet.
    assert codes == {"none": grpc.StatusCode.UNAUTHENTICATED, "job": grpc.StatusCode.NOT_FOUND}


def test_a_rotated_token_file_is_picked_up_and_both_tokens_work_during_the_rotation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cred, "RELOAD_SECONDS", 0.0)
    old, new = new_token(), new_token()
    path = write_token_file(tmp_path / "token", old)
    server_side = Credential.from_file(path)
    assert server_side.accepts(old)
    assert not server_side.accepts(new)
    path.write_text(f"{new}\n{old}\n")
    assert server_side.token() == new  # the first line is the one sent
    assert server_side.accepts(old)
    assert server_side.accepts(new)
    path.write_text(f"{new}\n")
    assert not server_side.accepts(old)


def test_an_empty_or_missing_token_file_is_an_error_naming_it(tmp_path: Path) -> None:
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(cred.CredentialError, match="holds no token"):
        Credential.from_file(tmp_path / "empty")
    with pytest.raises(cred.CredentialError, match="RLKUBE_TOKEN_FILE"):
        Credential.from_file(tmp_path / "missing")


def test_a_wrong_token_is_refused_by_the_coordinator_too(live: LiveJob) -> None:
    with live.client(Credential.of_token(live.credential.token() + "x")) as client:
        assert code_of(lambda: client.status()) == grpc.StatusCode.UNAUTHENTICATED


def _certificates(directory: Path) -> TlsFiles:
    """A CA and one certificate for localhost signed by it (server and client use), via openssl."""

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
            "-days", "1", "-subj", "/CN=rlkube-test-ca")  # fmt: skip
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "tls.key", "-out", "tls.csr",
            "-subj", "/CN=localhost")  # fmt: skip
    (directory / "ext.cnf").write_text(
        "subjectAltName=DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n"
    )
    openssl("x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "tls.crt", "-days", "1", "-extfile", "ext.cnf")  # fmt: skip
    return TlsFiles.read(directory)


def test_with_mtls_a_client_needs_both_a_signed_certificate_and_the_token(tmp_path: Path) -> None:
    tls = _certificates(tmp_path)
    token = new_token()
    server_credential = Credential.of_token(token, tls=tls)
    server = make_server(server_credential, max_workers=2, options=(), thread_name_prefix="tls-test")
    handler = grpc.method_handlers_generic_handler(
        "rlkube.v1.PolicyGroup",
        {
            "GetStatus": grpc.unary_unary_rpc_method_handler(
                lambda request, context: pb.JobStatus(phase="Running"),
                request_deserializer=pb.GetStatusRequest.FromString,
                response_serializer=pb.JobStatus.SerializeToString,
            )
        },
    )
    server.add_generic_rpc_handlers((handler,))
    port = listen(server, "localhost:0", server_credential)
    server.start()

    def status(credential: Credential) -> grpc.StatusCode | None:
        with open_channel(f"localhost:{port}", credential) as channel:
            call = channel.unary_unary(
                "/rlkube.v1.PolicyGroup/GetStatus",
                request_serializer=pb.GetStatusRequest.SerializeToString,
                response_deserializer=pb.JobStatus.FromString,
            )
            try:
                call(pb.GetStatusRequest(), timeout=5)
            except grpc.RpcError as exc:
                return exc.code()
            return None

    try:
        assert status(Credential.of_token(token, tls=tls)) is None
        assert status(Credential.of_token("wrong", tls=tls)) == grpc.StatusCode.UNAUTHENTICATED
        assert status(Credential.of_token(token)) == grpc.StatusCode.UNAVAILABLE  # plain TCP: no handshake
    finally:
        server.stop(0)
