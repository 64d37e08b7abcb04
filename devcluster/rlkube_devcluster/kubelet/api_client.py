"""A small REST client of the Kubernetes API for the node agent: JSON in, JSON out, a kubeconfig's identity.

Plain HTTPS with the kubeconfig's CA and client certificate (the node agent's ``system:node:<name>``
identity); every answer is the API's JSON as a dict, and a refusal raises :class:`ApiError` with
the status code and the server's message.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"


class ApiError(RuntimeError):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status


class KubeApi:
    def __init__(self, kubeconfig: Path, *, timeout: float = 30.0) -> None:
        document = yaml.safe_load(kubeconfig.read_text())
        current = document["current-context"]
        context = next(c["context"] for c in document["contexts"] if c["name"] == current)
        cluster = next(c["cluster"] for c in document["clusters"] if c["name"] == context["cluster"])
        user = next(u["user"] for u in document["users"] if u["name"] == context["user"])
        self.server = cluster["server"].rstrip("/")
        self.timeout = timeout
        self.context = ssl.create_default_context(cafile=cluster["certificate-authority"])
        self.context.load_cert_chain(user["client-certificate"], user["client-key"])

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        query: dict[str, str] | None = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        url = self.server + path + (f"?{urllib.parse.urlencode(query)}" if query else "")
        data = None if body is None else json.dumps(body).encode()
        headers = {"Accept": "application/json", **({"Content-Type": content_type} if data else {})}
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, context=self.context, timeout=self.timeout) as answer:
                return dict(json.loads(answer.read() or b"{}"))
        except urllib.error.HTTPError as exc:
            text = exc.read().decode(errors="replace")
            try:
                message = json.loads(text).get("message", text)
            except ValueError:
                message = text
            raise ApiError(exc.code, f"{method} {path}: {message}") from None

    def get(self, path: str, **query: str) -> dict[str, Any]:
        return self.request("GET", path, query=query or None)

    def get_or_none(self, path: str) -> dict[str, Any] | None:
        try:
            return self.get(path)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.request("POST", path, body)

    def patch(self, path: str, body: dict[str, Any], *, strategic: bool = False) -> dict[str, Any]:
        return self.request(
            "PATCH", path, body, content_type=STRATEGIC_MERGE_PATCH if strategic else MERGE_PATCH
        )

    def delete(self, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.request("DELETE", path, body)
