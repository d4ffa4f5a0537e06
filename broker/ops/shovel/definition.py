"""A dynamic shovel's definition: RabbitMQ's JSON keys, their checks and what they mean.

The keys and the texts of the errors are RabbitMQ 4.3's: rabbit_shovel_parameters:validate/5
runs rabbit_amqp091_shovel:validate_src/1 and validate_dest/1 (which of queue and exchange),
then rabbit_parameter_validation:proplist/3 over shovel_validation/0, validate_src_funs/2 and
validate_dest_funs/2 (one check per key, "Unrecognised terms" for the rest);
rabbit_runtime_parameters:flatten_errors/1 reports all of them, a line each. URIs are read
as amqp_uri:parse/2 reads them (rabbit_shovel_util:validate_uri/3). The defaults are
rabbit_amqp091_shovel:parse_source/1 and parse_dest/4's and rabbit_shovel.hrl's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote

from warren.broker.engine.deprecated import erlang_term

DEFAULT_PREFETCH = 1000  # rabbit_shovel.hrl, ?DEFAULT_PREFETCH
DEFAULT_RECONNECT_DELAY = 5  # rabbit_shovel.hrl, ?DEFAULT_RECONNECT_DELAY (seconds)
ACK_MODES = ("no-ack", "on-publish", "on-confirm")
# the shovel protocols Warren runs (RabbitMQ 4.3 registers amqp091, amqp10 and local)
PROTOCOLS = ("amqp091",)
PUBLISH_PROPERTIES = {
    "content_type": "binary", "content_encoding": "binary", "delivery_mode": "number",
    "priority": "number", "correlation_id": "binary", "reply_to": "binary",
    "expiration": "binary", "message_id": "binary", "timestamp": "number", "type": "binary",
    "user_id": "binary", "app_id": "binary", "cluster_id": "binary",
}  # fmt: skip


@dataclass(frozen=True)
class Uri:
    """One parsed ``amqp://`` or ``amqps://`` URI; no host: this broker, in process."""

    text: str
    scheme: str
    host: str | None
    port: int | None
    vhost: str
    user: str | None
    password: str | None
    heartbeat: int = 60
    connection_timeout: float = 30.0

    @property
    def direct(self) -> bool:
        return self.host is None

    @property
    def redacted(self) -> str:
        """The URI without credentials, as amqp_uri:remove_credentials/1 writes it."""
        rest = self.text.split("://", 1)[1]
        rest = rest.split("?", 1)[0]
        path = ""
        if "/" in rest:
            rest, path = rest.split("/", 1)
            path = "/" + path
        port = f":{self.port}" if self.port is not None else ""
        host = self.host or ""
        return f"{self.scheme}://{host}{port}{path}"


class UriError(ValueError):
    """amqp_uri:parse/2's error term, printed with ~tp."""


def parse_uri(text: str) -> Uri:
    if "://" not in text:
        raise UriError("{unable_to_parse_uri,no_scheme}")
    scheme, rest = text.split("://", 1)
    scheme = scheme.lower()
    if scheme not in ("amqp", "amqps"):
        raise UriError(f'{{unexpected_uri_scheme,"{scheme}"}}')
    query = ""
    if "?" in rest:
        rest, query = rest.split("?", 1)
    path: str | None = None
    if "/" in rest:
        rest, path = rest.split("/", 1)
    userinfo = ""
    if "@" in rest:
        userinfo, rest = rest.rsplit("@", 1)
    host: str | None = None
    port: int | None = None
    if rest.startswith("["):  # an IPv6 literal
        end = rest.find("]")
        if end < 0:
            raise UriError("{unable_to_parse_uri,{invalid_ipv6,...}}")
        host, rest = rest[1:end], rest[end + 1 :]
        if rest.startswith(":"):
            port = _port(rest[1:])
    elif ":" in rest:
        name, digits = rest.rsplit(":", 1)
        host = name or None
        port = _port(digits)
    elif rest:
        host = rest
    if port is not None and not 0 < port <= 65535:
        raise UriError(f"{{port_out_of_range,{port}}}")
    if host is None and port is not None:
        raise UriError("port_requires_host")
    if path is None:
        vhost = "/"
    elif "/" in path:
        raise UriError(f'{{invalid_vhost,"{path}"}}')
    else:
        vhost = unquote(path)
    user = password = None
    if userinfo:
        name, _, secret = userinfo.partition(":")
        user = unquote(name)
        password = unquote(secret) if ":" in userinfo else None
    params = {k: v[-1] for k, v in parse_qs(query).items()}
    heartbeat, timeout = 60, 30.0
    try:
        if "heartbeat" in params:
            heartbeat = int(params["heartbeat"])
        if "connection_timeout" in params:
            timeout = int(params["connection_timeout"]) / 1000
    except ValueError:
        raise UriError("{invalid_amqp_params_parameter,...}") from None
    return Uri(text, scheme, host, port, vhost, user, password, heartbeat, timeout)


def _port(digits: str) -> int | None:
    if not digits:
        return None
    if not digits.isdigit():
        raise UriError(f'{{unable_to_parse_uri,{{invalid_port,"{digits}"}}}}')
    return int(digits)


@dataclass
class ShovelConfig:
    """A valid definition, read with RabbitMQ's defaults."""

    vhost: str
    name: str
    src_uris: list[Uri]
    dest_uris: list[Uri]
    src_queue: str | None = None
    src_exchange: str | None = None
    src_exchange_key: str = ""
    src_queue_args: dict[str, Any] = field(default_factory=dict)
    consumer_args: dict[str, Any] = field(default_factory=dict)
    consumer_name: str = ""
    src_predeclared: bool = False
    prefetch: int = DEFAULT_PREFETCH
    delete_after: str | int = "never"
    delete_after_duration: int | None = None
    dest_queue: str | None = None
    dest_exchange: str | None = None
    dest_exchange_key: str | None = None
    dest_queue_args: dict[str, Any] = field(default_factory=dict)
    dest_predeclared: bool = False
    add_forward_headers: bool = False
    add_timestamp_header: bool = False
    publish_properties: dict[str, Any] = field(default_factory=dict)
    ack_mode: str = "on-confirm"
    reconnect_delay: float = DEFAULT_RECONNECT_DELAY


# -- checks, as rabbit_parameter_validation's ---------------------------------------------

Check = Any  # (key, value, vhost_exists) -> error text or None


def _number(key: str, value: Any) -> str | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return None
    return f"{key} should be a number, actually was {erlang_term(value)}"


def _binary(key: str, value: Any) -> str | None:
    if isinstance(value, str):
        return None
    return f"{key} should be binary, actually was {erlang_term(value)}"


def _boolean(key: str, value: Any) -> str | None:
    if isinstance(value, bool):
        return None
    return f"{key} should be boolean, actually was {erlang_term(value)}"


def _queue_name(key: str, value: Any) -> str | None:
    if not isinstance(value, str):
        return _binary(key, value)
    size = len(value.encode())
    return None if size <= 255 else f"{key} should be less than 255 bytes, actually was {size}"


def _enum(options: tuple[str, ...]) -> Check:
    listed = "[" + ",".join(erlang_term(o) for o in options) + "]"

    def check(key: str, value: Any) -> str | None:
        if not isinstance(value, str):
            return _binary(key, value)
        if value in options:
            return None
        return f"{key} should be one of {listed}, actually was {erlang_term(value)}"

    return check


def _delete_after(key: str, value: Any) -> str | None:
    if value in ("never", "queue-length"):
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return None
    return (
        f'{key} should be a number greater than or equal to 0, "never" or "queue-length", '
        f"actually was {erlang_term(value)}"
    )


def _delete_after_duration(key: str, value: Any) -> str | None:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return None
    return f"{key} should be a positive integer (seconds), actually was {erlang_term(value)}"


def _table(key: str, value: Any) -> str | None:
    if isinstance(value, dict):
        return None
    return f"{key} should be a table, actually was {erlang_term(value)}"


def _properties(key: str, value: Any) -> str | None:
    if not isinstance(value, dict):
        return f"{key} not a list {erlang_term(value)}"
    errors = _proplist(key, {k: _by_kind(kind) for k, kind in PUBLISH_PROPERTIES.items()}, value)
    return errors[0] if errors else None


def _by_kind(kind: str) -> Check:
    return _number if kind == "number" else _binary


def _uri(key: str, value: Any) -> str | None:
    if isinstance(value, str):
        try:
            parse_uri(value)
        except UriError as exc:
            return f'"{value}" not a valid URI: {{{exc},"{value}"}}'
        return None
    if not isinstance(value, list):
        return f"{key} should be list, actually was {erlang_term(value)}"
    for item in value:
        error = _uri(key, item)
        if error is not None:
            return error
    return None


MANDATORY = ("src-uri", "dest-uri")
CHECKS: dict[str, Check] = {
    # shovel_validation/0
    "internal": _boolean,
    "internal_owner": _table,
    "reconnect-delay": _number,
    "ack-mode": _enum(ACK_MODES),
    "src-protocol": _enum(PROTOCOLS),
    "dest-protocol": _enum(PROTOCOLS),
    # rabbit_amqp091_shovel:validate_src_funs/2
    "src-uri": _uri,
    "src-exchange": _binary,
    "src-exchange-key": _binary,
    "src-queue": _binary,
    "src-queue-args": _table,
    "src-consumer-args": _table,
    "src-consumer-name": _binary,
    "prefetch-count": _number,
    "src-prefetch-count": _number,
    "delete-after": _delete_after,
    "src-delete-after": _delete_after,
    "src-delete-after-duration": _delete_after_duration,
    "src-predeclared": _boolean,
    # validate_dest_funs/2
    "dest-uri": _uri,
    "dest-exchange": _binary,
    "dest-exchange-key": _binary,
    "dest-queue": _queue_name,
    "dest-queue-args": _table,
    "add-forward-headers": _boolean,
    "add-timestamp-header": _boolean,
    "dest-add-forward-headers": _boolean,
    "dest-add-timestamp-header": _boolean,
    "publish-properties": _properties,
    "dest-publish-properties": _properties,
    "dest-predeclared": _boolean,
}


def _proplist(name: str, checks: dict[str, Check], value: dict[str, Any]) -> list[str]:
    """rabbit_parameter_validation:proplist/3: unknown keys first, then each check's error
    in the reverse order of the checks (it folds them onto a list)."""
    errors: list[str] = []
    for key, check in checks.items():
        if key in value:
            error = check(key, value[key])
            if error is not None:
                errors.append(error)
        elif key in MANDATORY:
            errors.append(f'Key "{key}" not found in {name}')
    errors.reverse()
    unknown = sorted((k, v) for k, v in value.items() if k not in checks)
    if unknown:
        terms = ",".join(f"{{{erlang_term(k)},{erlang_term(v)}}}" for k, v in unknown)
        errors.insert(0, f"Unrecognised terms [{terms}] in {name}")
    return errors


def validate(name: str, value: Any) -> list[str]:
    """Every reason RabbitMQ 4.3 would refuse this definition; empty if it is valid."""
    if not isinstance(value, dict):
        return [f"{name} not a list {erlang_term(value)}"]
    errors: list[str] = []
    src = [k for k in ("src-exchange", "src-queue") if k in value]
    if not src:
        errors.append("Must specify 'src-exchange' or 'src-queue'")
    elif len(src) == 2:
        errors.append("Cannot specify 'src-exchange' and 'src-queue'")
    delete_after = value.get("src-delete-after", value.get("delete-after"))
    numeric = isinstance(delete_after, int) and not isinstance(delete_after, bool)
    if numeric and value.get("ack-mode") == "no-ack":
        errors.append("Cannot specify 'no-ack' and numerical 'delete-after'")
    dest = [k for k in ("dest-exchange", "dest-queue") if k in value]
    if len(dest) == 2:
        errors.append("Cannot specify 'dest-exchange' and 'dest-queue'")
    return errors + _proplist(name, CHECKS, value)


def _uris(value: str | list[str]) -> list[Uri]:
    return [parse_uri(u) for u in ([value] if isinstance(value, str) else value)]


def parse(vhost: str, name: str, value: dict[str, Any]) -> ShovelConfig:
    """A validated definition, with RabbitMQ's defaults and its legacy keys' fallbacks."""
    get = value.get
    delay = get("reconnect-delay", DEFAULT_RECONNECT_DELAY)
    prefetch = get("src-prefetch-count", get("prefetch-count", DEFAULT_PREFETCH))
    return ShovelConfig(
        vhost=vhost,
        name=name,
        src_uris=_uris(value["src-uri"]),
        dest_uris=_uris(value["dest-uri"]),
        src_queue=get("src-queue"),
        src_exchange=get("src-exchange"),
        src_exchange_key=get("src-exchange-key", ""),
        src_queue_args=dict(get("src-queue-args") or {}),
        consumer_args=dict(get("src-consumer-args") or {}),
        consumer_name=get("src-consumer-name", ""),
        src_predeclared=bool(get("src-predeclared", False)),
        prefetch=max(0, min(65535, int(prefetch))) if math.isfinite(prefetch) else 0,
        delete_after=get("src-delete-after", get("delete-after", "never")),
        delete_after_duration=get("src-delete-after-duration"),
        dest_queue=get("dest-queue"),
        dest_exchange=get("dest-exchange"),
        dest_exchange_key=get("dest-exchange-key"),
        dest_queue_args=dict(get("dest-queue-args") or {}),
        dest_predeclared=bool(get("dest-predeclared", False)),
        add_forward_headers=bool(
            get("dest-add-forward-headers", get("add-forward-headers", False))
        ),
        add_timestamp_header=bool(
            get("dest-add-timestamp-header", get("add-timestamp-header", False))
        ),
        publish_properties=dict(get("dest-publish-properties", get("publish-properties")) or {}),
        ack_mode=get("ack-mode", "on-confirm"),
        reconnect_delay=float(delay),
    )
