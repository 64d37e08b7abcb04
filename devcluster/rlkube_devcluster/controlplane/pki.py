"""The control plane's certificates and keys, made with the ``openssl`` command line.

One certificate authority signs the API server's serving certificate and every client
certificate; the API server maps a client certificate to a user (CN) and groups (O), as it does
on any cluster. EC P-256 keys: fast to make, and accepted for serving, client auth and
service-account tokens (ES256).
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

#: Valid long enough for any test run or dev cluster session.
_DAYS = "30"


class PkiError(RuntimeError):
    """A key or certificate could not be made."""


@dataclass(frozen=True)
class KeyPair:
    cert: Path
    key: Path


class CertificateAuthority:
    """A self-signed CA in ``directory`` that issues serving and client certificates."""

    def __init__(self, directory: Path) -> None:
        if shutil.which("openssl") is None:
            raise PkiError("the control plane's certificates need the `openssl` command; install OpenSSL")
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.cert = directory / "ca.crt"
        self.key = self._new_key("ca")
        _openssl(
            "req", "-x509", "-new", "-key", str(self.key), "-out", str(self.cert), "-days", _DAYS,
            "-subj", "/CN=rlkube-devcluster-ca",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
        )  # fmt: skip

    def serving(self, name: str, *, ips: list[str], dns: list[str]) -> KeyPair:
        """A server certificate for these addresses."""
        alt = ",".join([f"IP:{ip}" for ip in ips] + [f"DNS:{d}" for d in dns])
        return self._issue(name, f"/CN={name}", "serverAuth", alt)

    def client(self, name: str, *, user: str, groups: tuple[str, ...] = ()) -> KeyPair:
        """A client certificate the API server reads as ``user`` in ``groups``."""
        subject = "".join(f"/O={g}" for g in groups) + f"/CN={user}"
        return self._issue(name, subject, "clientAuth", None)

    def signing_key(self, name: str) -> KeyPair:
        """A bare key pair (``cert`` is the public key), e.g. for service-account tokens."""
        key = self._new_key(name)
        public = self.directory / f"{name}.pub"
        _openssl("pkey", "-in", str(key), "-pubout", "-out", str(public))
        return KeyPair(cert=public, key=key)

    def _issue(self, name: str, subject: str, usage: str, alt: str | None) -> KeyPair:
        key = self._new_key(name)
        csr = self.directory / f"{name}.csr"
        cert = self.directory / f"{name}.crt"
        _openssl("req", "-new", "-key", str(key), "-out", str(csr), "-subj", subject)
        extensions = self.directory / f"{name}.ext"
        extensions.write_text(
            "basicConstraints=critical,CA:FALSE\n"
            "keyUsage=critical,digitalSignature,keyEncipherment\n"
            f"extendedKeyUsage={usage}\n" + (f"subjectAltName={alt}\n" if alt else "")
        )
        _openssl(
            "x509", "-req", "-in", str(csr), "-CA", str(self.cert), "-CAkey", str(self.key),
            "-CAcreateserial", "-out", str(cert), "-days", _DAYS, "-extfile", str(extensions),
        )  # fmt: skip
        return KeyPair(cert=cert, key=key)

    def _new_key(self, name: str) -> Path:
        key = self.directory / f"{name}.key"
        _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(key))
        key.chmod(0o600)
        return key


def _openssl(*args: str) -> None:
    result = subprocess.run(["openssl", *args], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise PkiError(f"openssl {args[0]} failed: {result.stderr.strip()}")
