"""Helpers for the message-lifecycle tests (TTL, expiry, limits, dead-lettering, retry).

* ``typed_headers`` reads a delivery's ``headers`` table with every value's wire
  type, so tests can pin x-death entries exactly (a ``count`` is a long, a
  ``time`` a timestamp, ...);
* ``Policies`` sets policies on the broker under test: with rabbitmqctl (or,
  without it, the management API) when ``WARREN_TEST_URL`` points at RabbitMQ,
  else on a Warren run in-process (``running.call`` on the broker loop);
* small publish/declare helpers shared by the files.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import struct
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import quote, urlparse

from amqp_raw import Delivery, RawClient, build
from pamqp import commands

# the broker under test is an external one (RabbitMQ, the reference) rather than Warren
EXTERNAL = bool(os.environ.get("WARREN_TEST_URL"))

Typed = tuple[str, Any]  # (AMQP field type tag, value); tables and arrays decoded recursively


# -- field tables with their wire types ----------------------------------------------

_FIXED = {
    "t": ">B",
    "b": ">b",
    "B": ">B",
    "s": ">h",
    "u": ">H",
    "I": ">i",
    "i": ">I",
    "l": ">q",
    "f": ">f",
    "d": ">d",
    "T": ">Q",
}


def _value(data: bytes, i: int) -> tuple[Typed, int]:
    tag = chr(data[i])
    i += 1
    if tag in ("S", "x", "F", "A"):
        (n,) = struct.unpack_from(">I", data, i)
        i += 4
        raw = data[i : i + n]
        if tag == "S":
            return (tag, raw.decode()), i + n
        if tag == "x":
            return (tag, raw), i + n
        if tag == "F":
            return (tag, _items(raw)), i + n
        items: list[Typed] = []
        j = 0
        while j < n:
            item, j = _value(raw, j)
            items.append(item)
        return (tag, items), i + n
    if tag == "D":
        scale, unscaled = struct.unpack_from(">Bi", data, i)
        return (tag, (scale, unscaled)), i + 5
    if tag == "V":
        return (tag, None), i
    fmt = _FIXED[tag]
    return (tag, struct.unpack_from(fmt, data, i)[0]), i + struct.calcsize(fmt)


def _items(data: bytes) -> dict[str, Typed]:
    out: dict[str, Typed] = {}
    i = 0
    while i < len(data):
        n = data[i]
        key = data[i + 1 : i + 1 + n].decode()
        out[key], i = _value(data, i + 1 + n)
    return out


def typed_headers(delivery: Delivery) -> dict[str, Typed]:
    """The ``headers`` property of a delivery, each value as (type tag, value)."""
    payload = delivery.header_payload
    (flags,) = struct.unpack_from(">H", payload, 12)
    i = 14
    if flags & 0x8000:  # content-type
        i += 1 + payload[i]
    if flags & 0x4000:  # content-encoding
        i += 1 + payload[i]
    if not flags & 0x2000:
        return {}
    (n,) = struct.unpack_from(">I", payload, i)
    return _items(payload[i + 4 : i + 4 + n])


def plain(typed: Typed) -> Any:
    """A typed value without its tags (tables become dicts, arrays lists)."""
    tag, value = typed
    if tag == "F":
        return {k: plain(v) for k, v in value.items()}
    if tag == "A":
        return [plain(v) for v in value]
    return value


def deaths(delivery: Delivery) -> list[dict[str, Typed]]:
    """The x-death entries of a dead-lettered delivery, newest first, with wire types."""
    tag, entries = typed_headers(delivery)["x-death"]
    assert tag == "A", f"x-death is not an array but {tag!r}"
    out = []
    for entry_tag, entry in entries:
        assert entry_tag == "F", f"an x-death entry is not a table but {entry_tag!r}"
        out.append(entry)
    return out


def death_entry(
    *,
    queue: str,
    reason: str,
    exchange: str,
    routing_keys: list[str],
    count: int = 1,
    original_expiration: str | None = None,
) -> dict[str, Typed]:
    """What an x-death entry holds, except ``time`` (checked separately)."""
    entry: dict[str, Typed] = {
        "count": ("l", count),
        "reason": ("S", reason),
        "queue": ("S", queue),
        "exchange": ("S", exchange),
        "routing-keys": ("A", [("S", key) for key in routing_keys]),
    }
    if original_expiration is not None:
        entry["original-expiration"] = ("S", original_expiration)
    return entry


def without_time(entry: dict[str, Typed]) -> dict[str, Typed]:
    return {k: v for k, v in entry.items() if k != "time"}


def assert_recent_time(entry: dict[str, Typed], slack: float = 5.0) -> None:
    tag, value = entry["time"]
    assert tag == "T", f"x-death time is a {tag!r}, not a timestamp"
    assert abs(value - time.time()) < slack, f"x-death time {value} is not about now"


# -- small client helpers ----------------------------------------------------------------


def props(**kw: Any) -> commands.Basic.Properties:
    return commands.Basic.Properties(**kw)


def publish(
    c: RawClient,
    routing_key: str,
    *bodies: bytes,
    exchange: str = "",
    properties: commands.Basic.Properties | None = None,
    channel: int = 1,
) -> dict[int, bool]:
    """Publish with confirms and wait for them; returns {seq: acked?} for these publishes."""
    if channel not in c.publish_seq:
        c.confirm_select(channel)
    for body in bodies:
        c.publish(channel, body, exchange, routing_key, properties=properties)
    return c.wait_for_confirms(channel)


def message_count(c: RawClient, queue: str, channel: int = 1) -> int:
    return int(c.declare_queue(channel, queue, passive=True).message_count or 0)


def eventually(
    check: Callable[[], Any], timeout: float = 2.0, interval: float = 0.01, what: str = ""
) -> Any:
    """Poll ``check`` until it returns something truthy (RabbitMQ updates some counts later)."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result or time.monotonic() > deadline:
            assert result, f"timed out waiting for {what or check}"
            return result
        time.sleep(interval)


def queue_exists(c: RawClient, queue: str, channel: int = 1) -> bool:
    """Passive declare (note: this counts as a use for x-expires in RabbitMQ and Warren)."""
    c.send_method(channel, build(commands.Queue.Declare, queue=queue, passive=True))
    _, m = c.read_method()
    if isinstance(m, commands.Channel.Close):
        assert m.reply_code == 404, f"unexpected close {dict(m)}"
        c.send_method(channel, commands.Channel.CloseOk())
        c.channel_open(channel)
        return False
    assert isinstance(m, commands.Queue.DeclareOk), f"unexpected {m.name}"
    return True


def expect_close(c: RawClient, channel: int = 1) -> tuple[int, str, int, int]:
    """The channel is closed by the broker; reopen it and return (code, text, class, method)."""
    closed = c.expect_channel_close(channel)
    c.channel_open(channel)
    return closed


def declare_refused(
    c: RawClient, queue: str, arguments: dict[str, Any] | None = None, **kw: Any
) -> tuple[int, str, int, int]:
    kw.setdefault("durable", not kw.get("exclusive"))  # RabbitMQ 4.3: no transient shared queues
    c.send_method(1, build(commands.Queue.Declare, queue=queue, arguments=arguments or {}, **kw))
    return expect_close(c)


# -- policies on the broker under test -----------------------------------------------------


class Policies:
    """Set and clear policies in vhost "/" of the broker under test; cleared on exit."""

    def __init__(
        self, addr: tuple[str, int], setter: Callable[..., None], clearer: Callable[[str], None]
    ) -> None:
        self.addr = addr
        self._set = setter
        self._clear = clearer
        self.names: list[str] = []

    def set(
        self,
        name: str,
        pattern: str,
        definition: dict[str, Any],
        apply_to: str = "queues",
        priority: int = 0,
    ) -> None:
        self._set(name, pattern, definition, apply_to, priority)
        if name not in self.names:
            self.names.append(name)

    def clear(self, name: str) -> None:
        self._clear(name)
        if name in self.names:
            self.names.remove(name)

    def clear_all(self) -> None:
        for name in list(self.names):
            self.clear(name)


def _management(url: str) -> tuple[str, str, str]:
    parsed = urlparse(url)
    host = parsed.hostname or "127.0.0.1"
    base = os.environ.get("WARREN_TEST_MANAGEMENT_URL", f"http://{host}:15672")
    return base, parsed.username or "guest", parsed.password or "guest"


def _http(method: str, url: str, user: str, password: str, body: Any = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("content-type", "application/json")
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    request.add_header("authorization", f"Basic {token}")
    with urllib.request.urlopen(request, timeout=5) as response:
        raw = response.read()
    return json.loads(raw) if raw else None


def _rabbitmqctl(*args: str) -> None:
    subprocess.run(["rabbitmqctl", "-q", *args], check=True, capture_output=True, timeout=30)


@contextmanager
def policy_broker() -> Iterator[Policies]:
    """Policies on RabbitMQ (rabbitmqctl when on PATH, else the management API) or on an
    in-process Warren."""
    url = os.environ.get("WARREN_TEST_URL")
    if url:
        base, user, password = _management(url)
        parsed = urlparse(url)
        use_cli = shutil.which("rabbitmqctl") is not None and not os.environ.get(
            "WARREN_TEST_MANAGEMENT_URL"
        )

        def set_rabbit(
            name: str, pattern: str, definition: dict[str, Any], apply_to: str, priority: int
        ) -> None:
            if use_cli:
                _rabbitmqctl(
                    "set_policy",
                    "-p",
                    "/",
                    "--apply-to",
                    apply_to,
                    "--priority",
                    str(priority),
                    name,
                    pattern,
                    json.dumps(definition),
                )
                return
            _http(
                "PUT",
                f"{base}/api/policies/%2F/{quote(name, safe='')}",
                user,
                password,
                {
                    "pattern": pattern,
                    "definition": definition,
                    "apply-to": apply_to,
                    "priority": priority,
                },
            )

        def clear_rabbit(name: str) -> None:
            if use_cli:
                _rabbitmqctl("clear_policy", "-p", "/", name)
                return
            _http("DELETE", f"{base}/api/policies/%2F/{quote(name, safe='')}", user, password)

        policies = Policies(
            (parsed.hostname or "127.0.0.1", parsed.port or 5672), set_rabbit, clear_rabbit
        )
        try:
            yield policies
        finally:
            policies.clear_all()
        return

    from warren.broker.engine.policy import Policy
    from warren.broker.testkit import run_broker

    with run_broker() as running:
        vhost = running.call(lambda: running.server.broker.vhosts["/"])

        def set_warren(
            name: str, pattern: str, definition: dict[str, Any], apply_to: str, priority: int
        ) -> None:
            policy = Policy("/", name, pattern, definition, apply_to, priority)
            running.call(vhost.set_policy, policy)

        def clear_warren(name: str) -> None:
            running.call(vhost.clear_policy, name)

        yield Policies((running.host, running.port), set_warren, clear_warren)
