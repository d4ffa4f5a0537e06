"""The management API's errors, shaped as RabbitMQ's: ``{"error": ..., "reason": ...}``.

Handlers raise ``ApiError`` anywhere; the dispatcher turns it into the JSON
response, so no request ever ends in a stack trace.
"""

from __future__ import annotations

from typing import Any

from warren.protocol.constants import ACCESS_REFUSED, NOT_ALLOWED, NOT_FOUND
from warren.protocol.errors import AMQPError

AUTH_REALM = 'Basic realm="RabbitMQ Management"'


class ApiError(Exception):
    def __init__(
        self, status: int, error: str, reason: Any, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(f"{status} {error}: {reason}")
        self.status = status
        self.error = error
        self.reason = reason
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": self.error, "reason": self.reason}


def bad_request(reason: Any) -> ApiError:
    return ApiError(400, "bad_request", reason)


def not_found(reason: str | None = None) -> ApiError:
    """A missing object: RabbitMQ's generic 404, or a named reason (``vhost_not_found``)."""
    if reason is None:
        return ApiError(404, "Object Not Found", "Not Found")
    return ApiError(404, "not_found", reason)


def not_authorised(reason: str) -> ApiError:
    """Authenticated but not allowed (RabbitMQ answers 401 here, not 403)."""
    return ApiError(401, "not_authorised", reason)


def login_failed() -> ApiError:
    return ApiError(401, "not_authorized", "Login failed", {"WWW-Authenticate": AUTH_REALM})


def method_not_allowed(allowed: list[str]) -> ApiError:
    return ApiError(
        405,
        "method_not_allowed",
        "Method Not Allowed",
        {"Allow": ", ".join(allowed)},
    )


def detail(exc: AMQPError) -> str:
    """The reply text without its ``NAME - `` prefix (RabbitMQ's "explanation")."""
    return exc.text.split(" - ", 1)[1] if " - " in exc.text else exc.text


def from_operation(exc: AMQPError) -> ApiError:
    """An AMQP error from an operation the API runs as the user (declare, delete, bind, purge).

    RabbitMQ runs these as direct channel methods: 404 keeps the explanation,
    refusals become 401 "Access refused.", anything else is a 400.
    """
    if exc.code == NOT_FOUND:
        return not_found(detail(exc))
    if exc.code in (ACCESS_REFUSED, NOT_ALLOWED):
        return not_authorised("Access refused.")
    return bad_request(detail(exc))


def from_channel(exc: AMQPError) -> ApiError:
    """An AMQP error from an operation RabbitMQ runs on a real channel (publish, get, aliveness).

    There the whole reply text is kept, and other errors read ``"406 PRECONDITION_FAILED - ..."``.
    """
    if exc.code == NOT_FOUND:
        return not_found(exc.text)
    if exc.code == ACCESS_REFUSED:
        return not_authorised(exc.text)
    return bad_request(f"{exc.code} {exc.text}")
