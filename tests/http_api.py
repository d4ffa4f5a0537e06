"""A tiny blocking client for Warren's management API in tests (stdlib only)."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

if TYPE_CHECKING:
    from warren.broker.testkit import RunningBroker


def q(name: str) -> str:
    return quote(name, safe="")


@dataclass
class Reply:
    status: int
    body: Any
    headers: dict[str, str]
    raw: bytes


class HttpApi:
    def __init__(self, port: int, user: str = "guest", password: str = "guest") -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.user = user
        self.password = password

    def as_user(self, user: str, password: str) -> HttpApi:
        return HttpApi(int(self.base.rsplit(":", 1)[1]), user, password)

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        raw: bytes | None = None,
        headers: dict[str, str] | None = None,
        auth: bool = True,
    ) -> Reply:
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        req = urllib.request.Request(self.base + path, data=data, method=method)
        if auth:
            token = base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
            req.add_header("Authorization", "Basic " + token)
        if data is not None or method in ("POST", "PUT", "PATCH"):
            req.add_header("Content-Type", "application/json")  # as rabbitmqadmin sends it
        for key, value in (headers or {}).items():
            req.add_header(key, value)
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                status, payload, got = resp.status, resp.read(), dict(resp.headers)
        except urllib.error.HTTPError as exc:
            status, payload, got = exc.code, exc.read(), dict(exc.headers)
        try:
            decoded = json.loads(payload) if payload else None
        except ValueError:
            decoded = None
        return Reply(status, decoded, got, payload)

    def get(self, path: str) -> Reply:
        return self.request("GET", path)

    def put(self, path: str, body: Any = None) -> Reply:
        return self.request("PUT", path, {} if body is None else body)

    def post(self, path: str, body: Any = None) -> Reply:
        return self.request("POST", path, {} if body is None else body)

    def delete(self, path: str, headers: dict[str, str] | None = None) -> Reply:
        return self.request("DELETE", path, headers=headers)

    def ok(self, method: str, path: str, body: Any = None) -> Any:
        """The reply body of a request that must succeed (2xx)."""
        reply = self.request(method, path, body)
        assert 200 <= reply.status < 300, (method, path, reply.status, reply.body)
        return reply.body


def http(running: RunningBroker) -> HttpApi:
    """The management API of a broker the test kit started with a management port."""
    port = running.server.management_port
    assert port
    return HttpApi(port)
