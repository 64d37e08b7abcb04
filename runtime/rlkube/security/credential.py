"""The per-job credential: a bearer token read from a mounted file, and optional mTLS files.

No network I/O. The token file holds one token per line: the first is the one this process
sends, every line is accepted. That makes rotation a two-step edit of the Secret with no
downtime (add the new token as the first line, then, once every pod picked it up, drop the old
one); the file is re-read when its modification time changes, at most every
:data:`RELOAD_SECONDS`. The TLS directory is cert-manager's Secret layout: ``tls.crt``,
``tls.key`` and ``ca.crt``.
"""

from __future__ import annotations

import hmac
import os
import secrets
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

#: Env variables of the contract (rlkube.contract lists them; repeated here, the lower layer).
TOKEN_FILE_ENV = "RLKUBE_TOKEN_FILE"
TLS_DIR_ENV = "RLKUBE_TLS_DIR"
#: gRPC metadata key and scheme of the token (lower-case: gRPC metadata keys are).
METADATA_KEY = "authorization"
SCHEME = "Bearer "
#: How often at most the token file is checked for a new version (a rotated Secret).
RELOAD_SECONDS = 5.0
#: Bytes of randomness of a generated token (URL-safe base64: 43 characters).
TOKEN_BYTES = 32
#: The longest token accepted in a file (a token file is small; anything bigger is a mistake).
MAX_TOKEN_CHARS = 512


class CredentialError(ValueError):
    """The token file or the TLS directory is missing, empty or unreadable (the message says which)."""


def new_token() -> str:
    """A fresh random token (``secrets.token_urlsafe``)."""
    return secrets.token_urlsafe(TOKEN_BYTES)


def write_token_file(path: Path, token: str) -> Path:
    """Write ``token`` to ``path`` readable by its owner only; returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(token + "\n")
    return path


def _parse_tokens(text: str, where: str) -> tuple[str, ...]:
    tokens = tuple(line.strip() for line in text.splitlines() if line.strip())
    if not tokens:
        raise CredentialError(f"{where} holds no token")
    for token in tokens:
        if len(token) > MAX_TOKEN_CHARS or not token.isprintable() or " " in token:
            raise CredentialError(
                f"{where}: a token must be one printable word of <= {MAX_TOKEN_CHARS} chars"
            )
    return tokens


@dataclass(frozen=True)
class TlsFiles:
    """PEM bytes of this process's certificate, key, and the CA that signs every peer."""

    certificate: bytes
    key: bytes
    ca: bytes

    @classmethod
    def read(cls, directory: Path) -> TlsFiles:
        try:
            return cls(
                certificate=(directory / "tls.crt").read_bytes(),
                key=(directory / "tls.key").read_bytes(),
                ca=(directory / "ca.crt").read_bytes(),
            )
        except OSError as exc:
            raise CredentialError(f"{TLS_DIR_ENV}={directory}: {exc}") from None


@dataclass
class Credential:
    """What a process sends and accepts. ``Credential.open()``: no token, no TLS (tests, libraries)."""

    tokens: tuple[str, ...] = ()
    tls: TlsFiles | None = None
    #: The file the tokens came from (re-read when it changes); None: fixed tokens.
    path: Path | None = None
    _mtime: float = 0.0
    _checked: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _accepted: tuple[bytes, ...] = ()

    def __post_init__(self) -> None:
        self._accepted = tuple(t.encode() for t in self.tokens)

    @classmethod
    def open(cls) -> Credential:
        return cls()

    @classmethod
    def of_token(cls, token: str, *, tls: TlsFiles | None = None) -> Credential:
        return cls(tokens=(token,), tls=tls)

    @classmethod
    def from_file(cls, path: Path, *, tls: TlsFiles | None = None) -> Credential:
        try:
            stat = path.stat()
            text = path.read_text()
        except OSError as exc:
            raise CredentialError(f"{TOKEN_FILE_ENV}={path}: {exc}") from None
        cred = cls(tokens=_parse_tokens(text, f"{TOKEN_FILE_ENV}={path}"), tls=tls, path=path)
        cred._mtime = stat.st_mtime
        cred._checked = time.monotonic()
        return cred

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> Credential:
        """The credential the env contract names (token file, TLS directory); open when neither is set."""
        env = os.environ if environ is None else environ
        tls_dir = env.get(TLS_DIR_ENV, "").strip()
        tls = TlsFiles.read(Path(tls_dir)) if tls_dir else None
        token_file = env.get(TOKEN_FILE_ENV, "").strip()
        if token_file:
            return cls.from_file(Path(token_file), tls=tls)
        return cls(tls=tls)

    @property
    def enforced(self) -> bool:
        """Whether servers built with this credential refuse calls without a valid token."""
        return bool(self.tokens)

    def _refresh(self) -> None:
        if self.path is None:
            return
        now = time.monotonic()
        if now - self._checked < RELOAD_SECONDS:
            return
        with self._lock:
            if now - self._checked < RELOAD_SECONDS:
                return
            self._checked = now
            try:
                stat = self.path.stat()
                if stat.st_mtime == self._mtime:
                    return
                tokens = _parse_tokens(self.path.read_text(), str(self.path))
            except (OSError, CredentialError):
                return  # keep the tokens we have: a Secret being swapped is briefly unreadable
            self._mtime = stat.st_mtime
            self.tokens = tokens
            self._accepted = tuple(t.encode() for t in tokens)

    def token(self) -> str:
        """The token this process sends ('' when open)."""
        self._refresh()
        return self.tokens[0] if self.tokens else ""

    def accepts(self, presented: str) -> bool:
        """Constant-time check of a presented token against every accepted one."""
        self._refresh()
        candidate = presented.encode()
        ok = False
        for accepted in self._accepted:
            ok |= hmac.compare_digest(candidate, accepted)
        return ok


_process: dict[tuple[str, str], Credential] = {}
_process_lock = threading.Lock()


def process_credential() -> Credential:
    """This process's credential from its environment (read once per token file / TLS directory)."""
    key = (os.environ.get(TOKEN_FILE_ENV, "").strip(), os.environ.get(TLS_DIR_ENV, "").strip())
    with _process_lock:
        cred = _process.get(key)
        if cred is None:
            cred = _process[key] = Credential.from_environ()
        return cred
