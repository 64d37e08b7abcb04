"""Who may talk to a job's gRPC servers: the per-job credential and optional mutual TLS.

``credential`` (no network I/O; reads the mounted token file and certificates) says what a
process proves and accepts; ``grpc_auth`` (I/O) builds every gRPC server the runtime starts and
every channel it opens, with one server interceptor checking the bearer token and one client
interceptor attaching it. Below ``weights`` and ``coordinator`` in the layers, so both use the
same code, and light enough for the operator (no torch).
"""

from rlkube.security.credential import Credential, TlsFiles, new_token, write_token_file

__all__ = ["Credential", "TlsFiles", "new_token", "write_token_file"]
