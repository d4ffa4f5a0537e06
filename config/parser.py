"""Read RabbitMQ's ``rabbitmq.conf`` (sysctl-style) format into :class:`Settings`.

The format: one ``key = value`` per line; keys are dot-separated words of
letters, digits, ``_`` and ``-`` (``\\.`` puts a literal dot in a word);
``#`` starts a comment at the start of a line or after whitespace; a value
may be wrapped in single quotes to keep a ``#`` or surrounding spaces.

Parsing happens in three steps:

1. every line is split into key and value (syntax errors stop here);
2. every key is looked up in ``_KEYS`` / ``_FAMILIES`` and its value
   converted, or the key is recorded as ignored, or rejected; a later
   definition of the same key replaces an earlier one;
3. the surviving values are copied into fields, directly (``_Key.field``)
   or by the translations that combine several keys (listeners,
   permissions, tags, loopback users, memory watermark).

Every error is a :class:`ConfigError` naming file, line, key and what
would be accepted, so a bad file never starts a half-configured broker.
As cuttlefish does, every line is checked before giving up: one
ConfigError carries all the mistakes (``errors``), so a file is fixed in
one pass.
"""

from __future__ import annotations

import difflib
import ipaddress
import os
import re
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from warren.config.settings import Listener, Settings
from warren.protocol.constants import FRAME_MIN_SIZE

__all__ = ["ConfigError", "load_settings", "parse_config"]

ENV_CONFIG_FILE = "RABBITMQ_CONFIG_FILE"
# environment variables that win over the file, as in RabbitMQ
ENV_OVERRIDES: Mapping[str, str] = {
    "RABBITMQ_DEFAULT_USER": "default_user",
    "RABBITMQ_DEFAULT_PASS": "default_pass",
    "RABBITMQ_DEFAULT_VHOST": "default_vhost",
}


class ConfigError(ValueError):
    """A configuration that Warren refuses to start with.

    ``str()`` reads ``file:line: key = value: what is accepted``; parts that
    do not apply (no line for an unreadable file, no value for a malformed
    key, no key at all for a line that has none) are left out.
    """

    def __init__(
        self,
        message: str,
        *,
        filename: str | None = None,
        lineno: int | None = None,
        key: str | None = None,
        value: str | None = None,
    ) -> None:
        self.message = message
        self.filename = filename
        self.lineno = lineno
        self.key = key
        self.value = value
        self.errors: tuple[ConfigError, ...] = (self,)
        super().__init__(self._render())

    @classmethod
    def combine(cls, errors: list[ConfigError]) -> ConfigError:
        """One error for all of them: the first one's fields, every one's text."""
        if len(errors) == 1:
            return errors[0]
        first = errors[0]
        combined = cls(
            first.message,
            filename=first.filename,
            lineno=first.lineno,
            key=first.key,
            value=first.value,
        )
        combined.errors = tuple(errors)
        combined.args = ("\n".join(str(e) for e in errors),)
        return combined

    def _render(self) -> str:
        parts: list[str] = []
        if self.filename is not None:
            parts.append(self.filename if self.lineno is None else f"{self.filename}:{self.lineno}")
        if self.key is not None:
            if self.value is None:
                parts.append(self.key)
            else:
                parts.append(f"{self.key} = {_shown(self.key, self.value)}".rstrip())
        parts.append(self.message)
        return ": ".join(parts)


class _Invalid(Exception):
    """Raised by a converter; its text says what would have been accepted."""


# --------------------------------------------------------------------------
# value converters: str -> value, or _Invalid("expected ...")

Converter = Callable[[str], object]

# digit counts are capped so int() never sees a huge string
_INT = re.compile(r"-?[0-9]{1,20}")
_DECIMAL = re.compile(r"[0-9]+(?:\.[0-9]*)?|\.[0-9]+")
_BYTESIZE = re.compile(r"([0-9]{1,20})(KB|kb|MB|mb|GB|gb)?")
_INFORMATION = re.compile(r"([0-9]{1,20})([A-Za-z]{0,3})")
_HOSTNAME = re.compile(
    r"(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*"
)
_KIB, _MIB, _GIB = 1024, 1024**2, 1024**3
# RabbitMQ's information units, matched without regard to case: the bare
# letter and the "i" forms are powers of 1024, the "B" forms powers of 1000
_INFORMATION_UNITS: Mapping[str, int] = {
    "": 1,
    **{u: 1024**n for n, p in enumerate("kmgtp", 1) for u in (p, p + "i", p + "ib")},
    **{p + "b": 1000**n for n, p in enumerate("kmgtp", 1)},
}
# cuttlefish's "bytesize" (frame_max): KB/MB/GB are powers of 1024
_BYTESIZE_UNITS: Mapping[str, int] = {"kb": _KIB, "mb": _MIB, "gb": _GIB}
_INFORMATION_HELP = (
    "expected a size in bytes: an integer with an optional unit, e.g. 50000000, 500MB, 1GiB "
    "(kB MB GB TB = powers of 1000; k M G T, KiB MiB GiB TiB = powers of 1024)"
)


def _int_between(low: int, high: int | None, expected: str) -> Callable[[str], int]:
    def convert(text: str) -> int:
        if not _INT.fullmatch(text):
            raise _Invalid(expected)
        number = int(text)
        if number < low or (high is not None and number > high):
            raise _Invalid(expected)
        return number

    return convert


def _int_or_unlimited(low: int, expected: str) -> Converter:
    """An integer >= low, or ``infinity``/``none`` meaning no limit (None)."""
    as_int = _int_between(low, None, expected)

    def convert(text: str) -> int | None:
        return None if text in ("infinity", "none") else as_int(text)

    return convert


def _port(low: int, expected: str) -> Callable[[str], int]:
    def convert(text: str) -> int:
        if not re.fullmatch(r"[0-9]{1,5}", text) or not low <= int(text) <= 65535:
            raise _Invalid(expected)
        return int(text)

    return convert


_http_port = _port(1, "expected a port number from 1 to 65535, or 'none'")


def _port_or_none(text: str) -> int | None:
    """An HTTP endpoint's port; Warren's ``none`` turns the endpoint off."""
    return None if text == "none" else _http_port(text)


def _frame_max(text: str) -> int:
    # below 8192 no client could tune: 4.1+ refuses a tune-ok under ?FRAME_MIN_SIZE
    expected = (
        "expected 0 (no limit) or a frame size from 8192 to 2147483647 bytes "
        "(KB, MB, GB suffixes are powers of 1024)"
    )
    match = _BYTESIZE.fullmatch(text)
    if not match:
        raise _Invalid(expected)
    size = int(match[1]) * _BYTESIZE_UNITS.get((match[2] or "").lower(), 1)
    if size != 0 and not FRAME_MIN_SIZE <= size <= 2**31 - 1:
        raise _Invalid(expected)
    return size


def _frame_min_size(text: str) -> int:
    if text not in ("4096", "8192"):
        raise _Invalid("expected 8192 (RabbitMQ 4.1+) or 4096 (3.x)")
    return int(text)


def _information_unit(text: str) -> int:
    match = _INFORMATION.fullmatch(text)
    multiplier = _INFORMATION_UNITS.get(match[2].lower()) if match else None
    if match is None or multiplier is None:
        raise _Invalid(_INFORMATION_HELP)
    return int(match[1]) * multiplier


def _information_unit_or_infinity(text: str) -> int | None:
    return None if text == "infinity" else _information_unit(text)


def _fraction(text: str) -> float:
    if not _DECIMAL.fullmatch(text):
        raise _Invalid("expected a number >= 0 (a fraction of total memory, e.g. 0.6)")
    return float(text)


def _boolean(text: str) -> bool:
    if text not in ("true", "false"):
        raise _Invalid("expected 'true' or 'false'")
    return text == "true"


def _none(text: str) -> bool:
    """Keys such as ``listeners.tcp`` whose only value is ``none``."""
    if text != "none":
        raise _Invalid("expected 'none' (to configure entries, use the dotted keys below it)")
    return True


def _choice(*choices: str, aliases: Mapping[str, str] | None = None) -> Converter:
    table = {c: c for c in choices} | dict(aliases or {})
    expected = "expected one of: " + ", ".join(choices)

    def convert(text: str) -> str:
        if text not in table:
            raise _Invalid(expected)
        return table[text]

    return convert


def _text(text: str) -> str:
    if not text:
        raise _Invalid("expected a non-empty string")
    return text


def _path(text: str) -> str:
    if not text:
        raise _Invalid("expected a path")
    return text


def _vhost_list(text: str) -> tuple[str, ...] | None:
    """``all`` (None: every vhost, also those created later) or a comma-separated list."""
    if text == "all":
        return None
    names = tuple(name.strip() for name in text.split(","))
    if not all(names):
        raise _Invalid("expected 'all' or a comma-separated list of vhost names, e.g. /,orders")
    return names


def _regex(text: str) -> str:
    try:
        re.compile(text)
    except re.error as exc:
        raise _Invalid(f"expected a regular expression such as '.*' ({exc})") from None
    return text


def _host(text: str) -> str:
    """An IPv4/IPv6 address (without brackets) or a host name."""
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        pass
    if _HOSTNAME.fullmatch(text) and not re.fullmatch(r"[0-9.]+", text):
        return text
    raise _Invalid("expected an IP address or a host name")


def _listener_address(text: str) -> tuple[str, int]:
    expected = (
        "expected a port (5672), 'address:port' (127.0.0.1:5672) "
        "or '[IPv6 address]:port' ([::1]:5672), with a port from 0 to 65535"
    )
    port = _port(0, expected)
    if re.fullmatch(r"[0-9]+", text):
        return "", port(text)  # every address, IPv6 and IPv4 (config.Listener)
    bracketed = re.fullmatch(r"\[([^\]]+)\]:([^:]*)", text)
    if bracketed:
        host, port_text = bracketed[1], bracketed[2]
        if ":" not in host:
            raise _Invalid(expected)
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep or not host:
            raise _Invalid(expected)
    try:
        return _host(host), port(port_text)
    except _Invalid:
        raise _Invalid(expected) from None


# --------------------------------------------------------------------------
# the key table


@dataclass(frozen=True)
class _Key:
    convert: Converter
    # the Settings field the value goes to; None for keys that a translation
    # below combines with others
    field: str | None = None


_KEYS: Mapping[str, _Key] = {
    "listeners.tcp": _Key(_none),
    "listeners.ssl": _Key(_none),
    "ssl_options.cacertfile": _Key(_path, "ssl_cacertfile"),
    "ssl_options.certfile": _Key(_path, "ssl_certfile"),
    "ssl_options.keyfile": _Key(_path, "ssl_keyfile"),
    "ssl_options.verify": _Key(_choice("verify_none", "verify_peer"), "ssl_verify"),
    "ssl_options.fail_if_no_peer_cert": _Key(_boolean, "ssl_fail_if_no_peer_cert"),
    "default_user": _Key(_text, "default_user"),
    "default_pass": _Key(_text, "default_pass"),
    "default_vhost": _Key(_text, "default_vhost"),
    "default_queue_type": _Key(_choice("classic", "quorum", "stream"), "default_queue_type"),
    "quorum_queue.property_equivalence.relaxed_checks_on_redeclaration": _Key(
        _boolean, "quorum_relaxed_checks_on_redeclaration"
    ),
    "default_permissions.configure": _Key(_regex),
    "default_permissions.write": _Key(_regex),
    "default_permissions.read": _Key(_regex),
    "loopback_users": _Key(_none),
    "heartbeat": _Key(
        _int_between(0, 65535, "expected an integer from 0 to 65535 (seconds; 0 disables)"),
        "heartbeat",
    ),
    "frame_max": _Key(_frame_max, "frame_max"),
    "channel_max": _Key(
        _int_between(0, 65535, "expected an integer from 0 to 65535 (0 means no limit)"),
        "channel_max",
    ),
    "handshake_timeout": _Key(
        _int_between(1, None, "expected a positive integer (milliseconds)"), "handshake_timeout"
    ),
    "connection_max": _Key(
        _int_or_unlimited(1, "expected a positive integer, or 'infinity'"), "connection_max"
    ),
    "consumer_timeout": _Key(
        _int_or_unlimited(1, "expected a positive integer (milliseconds), or 'infinity'"),
        "consumer_timeout",
    ),
    "consumer_max_per_channel": _Key(
        _int_or_unlimited(1, "expected a positive integer, or 'infinity'"),
        "consumer_max_per_channel",
    ),
    "max_unconfirmed_per_channel": _Key(
        _int_or_unlimited(1, "expected a positive integer, or 'infinity'"),
        "max_unconfirmed_per_channel",
    ),
    "max_message_size": _Key(
        _int_between(1, 536870912, "expected an integer from 1 to 536870912 (bytes)"),
        "max_message_size",
    ),
    "product.name": _Key(_text, "product_name"),
    "message_interceptors.incoming.set_header_timestamp.overwrite": _Key(
        _boolean, "interceptor_timestamp"
    ),
    "message_interceptors.incoming.set_header_routing_node.overwrite": _Key(
        _boolean, "interceptor_routing_node"
    ),
    "product.version": _Key(_text, "product_version"),
    "log.console": _Key(_boolean, "log_console"),
    "log.console.level": _Key(
        _choice(
            "debug",
            "info",
            "warning",
            "error",
            "critical",
            "none",
            # RabbitMQ's syslog-style levels, mapped onto Python's
            aliases={"notice": "info", "alert": "critical", "emergency": "critical"},
        ),
        "log_level",
    ),
    "log.console.formatter": _Key(_choice("plaintext", "json"), "log_formatter"),
    "management.tcp.port": _Key(_port_or_none, "management_port"),
    "management.tcp.ip": _Key(_host, "management_ip"),
    "prometheus.tcp.port": _Key(_port_or_none, "prometheus_port"),
    "prometheus.tcp.ip": _Key(_host, "prometheus_ip"),
    "vm_memory_high_watermark.relative": _Key(_fraction),
    "vm_memory_high_watermark.absolute": _Key(_information_unit),
    "disk_free_limit.absolute": _Key(_information_unit, "disk_free_limit_absolute"),
    "load_definitions": _Key(_path, "load_definitions"),
    "data_dir": _Key(_path, "data_dir"),
    "message_store.segment_size": _Key(_information_unit, "segment_size"),
    "queue_body_memory_limit": _Key(_information_unit_or_infinity, "queue_body_memory_limit"),
    "trace.enabled": _Key(_boolean, "trace_enabled"),
    "exchange_types.local_random.enabled": _Key(_boolean, "local_random_exchange_enabled"),
    "trace.dir": _Key(_path, "trace_dir"),
    "trace.vhosts": _Key(_vhost_list, "trace_vhosts"),
    "trace.rotate_size": _Key(_information_unit, "trace_rotate_size"),
    "trace.rotate_interval": _Key(
        _int_between(1, None, "expected a positive integer (seconds)"), "trace_rotate_interval"
    ),
    "trace.buffer": _Key(
        _int_between(1, None, "expected a positive integer (events)"), "trace_buffer"
    ),
    "warren.clock": _Key(_choice("real", "manual"), "clock"),
    "warren.test_api": _Key(_boolean, "test_api"),
    "warren.delivery_limit.count_nacks": _Key(_boolean, "delivery_limit_counts_nacks"),
    "warren.frame_min_size": _Key(_frame_min_size, "frame_min_size"),
    "warren.handshake_max": _Key(
        _int_between(1, None, "expected a positive integer (connections)"), "handshake_max"
    ),
    "warren.descriptor_reserve": _Key(
        _int_between(0, None, "expected a non-negative integer (descriptors)"),
        "descriptor_reserve",
    ),
    # a consumer whose oldest unsettled delivery has waited this long shows as stuck in
    # /api/consumers and the console (ms; seen at each collect_statistics_interval)
    "warren.consumer_stuck_after": _Key(
        _int_between(1, None, "expected a positive integer (milliseconds)"),
        "consumer_stuck_after",
    ),
    "collect_statistics_interval": _Key(
        _int_between(100, None, "expected an integer of at least 100 (milliseconds)"),
        "collect_statistics_interval",
    ),
    "warren.read_coalescing_interval": _Key(
        _int_between(0, 100, "expected an integer from 0 to 100 (milliseconds)"),
        "read_coalescing_interval",
    ),
    # RabbitMQ's rabbit app setting of that name (advanced.config, or rabbitmq-diagnostics
    # enable_auth_attempt_source_tracking): auth_attempts_detailed_* by address and user
    "warren.track_auth_attempt_source": _Key(_boolean, "track_auth_attempt_source"),
}

# keys of the form "<family>.<name>", one entry per name
_FAMILIES: Mapping[str, Converter] = {
    "listeners.tcp": _listener_address,
    "listeners.ssl": _listener_address,
    "default_user_tags": _boolean,
    "loopback_users": _boolean,
    "deprecated_features.permit": _boolean,
}

# RabbitMQ keys (and key prefixes) that Warren accepts without using them.
# The longest matching prefix in _IGNORED or _CHECKED decides, so that e.g.
# log.file.level is ignored while a misspelt log.console.levle is an error.
_IGNORED: tuple[str, ...] = (
    # networking, TLS options other than those read above, Erlang distribution
    "num_acceptors",
    "tcp_listen_options",
    "socket_writer",
    "ssl_options",
    "ssl_handshake_timeout",
    "ssl_allow_poodle_attack",
    "ssl_cert_login_from",
    "ssl_cert_login_san_type",
    "ssl_cert_login_san_index",
    "reverse_dns_lookups",
    "proxy_protocol",
    "distribution",
    "net_ticktime",
    "erlang",
    # authentication and authorisation backends
    "auth_backends",
    "auth_mechanisms",
    "auth_cache",
    "auth_http",
    "auth_ldap",
    "auth_oauth2",
    "password_hashing_module",
    "credential_validator",
    "anonymous_login_user",
    "anonymous_login_pass",
    # users, vhosts, policies and definitions beyond the defaults
    "default_users",
    "default_policies",
    "default_limits",
    "default_consumer_prefetch",
    "definitions",
    "runtime_parameters",
    # limits and timeouts Warren does not enforce
    "channel_operation_timeout",
    "channel_max_per_node",
    "ranch_connection_max",
    "session_max_per_connection",
    "link_max_per_session",
    "vhost_max",
    "cluster_queue_limit",
    "initial_frame_max",
    # clustering and replication
    "cluster_formation",
    "cluster_name",
    "cluster_partition_handling",
    "cluster_keepalive_interval",
    "cluster_tags",
    "delegate_count",
    "mnesia_table_loading_retry_timeout",
    "mnesia_table_loading_retry_limit",
    "metadata_store",
    "queue_master_locator",
    "queue_leader_locator",
    "mirroring_sync_batch_size",
    "mirroring_sync_max_throughput",
    "deprecated_features",  # but deprecated_features.permit.<name> is read (_FAMILIES)
    "raft",
    "quorum_queue",
    "classic_queue",
    "stream",
    # memory, disk and storage tuning
    "disk_free_limit.relative",
    "vm_memory_high_watermark_paging_ratio",
    "vm_memory_calculation_strategy",
    "memory_monitor_interval",
    "total_memory_available_override_value",
    "queue_index_embed_msgs_below",
    "queue_index_max_journal_entries",
    "message_store_shutdown_timeout",
    "msg_store_index_module",
    "msg_store_file_size_limit",
    "msg_store_credit_disc_bound",
    "msg_store_io_batch_size",
    "credit_flow_default_credit",
    "background_gc_enabled",
    "background_gc_target_interval",
    "lazy_queue_explicit_gc_run_operation_threshold",
    "queue_explicit_gc_run_operation_threshold",
    "hipe_compile",
    "vhost_restart_strategy",
    "default_worker_pool_size",
    "sysmon_handler",
    "message_interceptors",
    # statistics, logging other than the console, the message of the day
    "collect_statistics",
    "log",
    "log.console.stdio",
    "log.console.use_colors",
    "log.console.color_esc_seqs",
    "log.console.formatter",  # its sub-keys; log.console.formatter itself is read
    "motd_file",
    # plugins
    "management",
    "management_agent",
    "prometheus",
    "mqtt",
    "stomp",
    "web_stomp",
    "web_mqtt",
    "web_dispatch",
    "amqp1_0",
    "amqp_client",
    "shovel",
    "federation",
    "trust_store",
)
# prefixes inside an ignored one that Warren reads, where unknown keys are errors
_CHECKED: tuple[str, ...] = ("log.console",)

# keys offered when a key is misspelt
_KNOWN_NAMES: tuple[str, ...] = (
    *_KEYS,
    "listeners.tcp.default",
    "listeners.ssl.default",
    "default_user_tags.administrator",
    "loopback_users.guest",
    "deprecated_features.permit.transient_nonexcl_queues",
)


def _is_ignored(key: str) -> bool:
    best, ignored = -1, False
    for prefixes, verdict in ((_IGNORED, True), (_CHECKED, False)):
        for prefix in prefixes:
            if (key == prefix or key.startswith(prefix + ".")) and len(prefix) > best:
                best, ignored = len(prefix), verdict
    return ignored


# --------------------------------------------------------------------------
# step 1: lines

_WORD = re.compile(r"(?:\\\.|[A-Za-z0-9_-])+")
_KEY = re.compile(rf"{_WORD.pattern}(?:\.{_WORD.pattern})*")
_COMMENT = re.compile(r"(?:^|\s)#")
_QUOTED = re.compile(r"'([^']*)'\s*(?:#.*)?")
_SECRET = re.compile(r"pass|pasw|secret|token", re.IGNORECASE)


@dataclass(frozen=True)
class _Line:
    filename: str
    lineno: int
    key: str
    value: str

    def error(self, message: str, *, show_value: bool = True) -> ConfigError:
        return ConfigError(
            message,
            filename=self.filename,
            lineno=self.lineno,
            key=self.key,
            value=self.value if show_value else None,
        )


def _shown(key: str, value: str) -> str:
    """A value as error messages show it: secrets masked, long ones cut."""
    if value and _SECRET.search(key):
        return "********"
    return value if len(value) <= 80 else value[:77] + "..."


def _lines(text: str, filename: str) -> Iterator[_Line | ConfigError]:
    """Each line's key and value, or the error that line has; reading goes on after one."""
    text = text.removeprefix("\ufeff")
    for lineno, raw in enumerate(text.split("\n"), 1):
        line = raw.rstrip("\r").strip()
        if not line or line.startswith("#"):
            continue
        key, sep, rest = line.partition("=")
        key = key.strip()
        if not sep:
            first = line.split()[0]
            if first == "include":
                yield ConfigError(
                    "'include' is not supported; put extra files in conf.d/ next to this one",
                    filename=filename,
                    lineno=lineno,
                )
                continue
            yield ConfigError(
                f"expected 'key = value', got {_shown(first, line)!r}",
                filename=filename,
                lineno=lineno,
                key=first if _KEY.fullmatch(first) else None,
            )
            continue
        if not key:
            yield ConfigError(
                "expected 'key = value', got no key before '='", filename=filename, lineno=lineno
            )
            continue
        where = _Line(filename, lineno, key, "")
        if not _KEY.fullmatch(key):
            yield where.error(
                "malformed key: expected words of letters, digits, '_' and '-' joined by dots",
                show_value=False,
            )
            continue
        quoted = _QUOTED.fullmatch(rest.strip())
        if quoted:
            value = quoted[1]
        else:
            comment = _COMMENT.search(rest)
            value = (rest[: comment.start()] if comment else rest).strip()
            if not value:
                yield where.error("missing value after '='")
                continue
        yield _Line(filename, lineno, key, value)


# --------------------------------------------------------------------------
# step 2: keys and values


@dataclass(frozen=True)
class _Setting:
    line: _Line
    value: object
    family: str | None = None  # for "<family>.<name>" keys
    name: str | None = None


class _Conf:
    """The merged settings of all files: the last definition of a key wins."""

    def __init__(self) -> None:
        self.settings: dict[str, _Setting] = {}
        self.ignored: dict[str, None] = {}  # an ordered set
        self.files: list[str] = []
        self.errors: list[ConfigError] = []

    def add(self, text: str, filename: str) -> None:
        for line in _lines(text, filename):
            if isinstance(line, ConfigError):
                self.errors.append(line)
                continue
            try:
                setting = _convert(line)
            except ConfigError as exc:
                self.errors.append(exc)
                continue
            if setting is None:
                self.ignored[line.key] = None
            else:
                self.settings[line.key] = setting

    def value(self, key: str) -> object:
        setting = self.settings.get(key)
        return None if setting is None else setting.value

    def members(self, family: str) -> list[_Setting]:
        return [s for s in self.settings.values() if s.family == family]


def _convert(line: _Line) -> _Setting | None:
    """The converted setting, None for an ignored key; or ConfigError."""
    key = line.key
    spec = _KEYS.get(key)
    words = _WORD.findall(key)
    family = ".".join(words[:-1])
    convert = spec.convert if spec is not None else _FAMILIES.get(family)
    if convert is None:
        if _is_ignored(key) and not _misspelt_tls_key(key):
            return None
        close = difflib.get_close_matches(key, _KNOWN_NAMES, n=1, cutoff=0.75)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise line.error(f"unknown key{hint}; see rabbitmq.conf.example for the keys Warren reads")
    try:
        value = convert(line.value)
    except _Invalid as exc:
        raise line.error(str(exc)) from None
    if spec is not None:
        return _Setting(line, value)
    return _Setting(line, value, family, words[-1].replace("\\.", "."))


def _misspelt_tls_key(key: str) -> bool:
    """``ssl_options.fail_if_no_peer_crt`` would otherwise be ignored with a mere warning,
    and the broker would start without the client-certificate check it was asked for."""
    if not key.startswith("ssl_options."):
        return False
    read = [k for k in _KEYS if k.startswith("ssl_options.")]
    return bool(difflib.get_close_matches(key, read, n=1, cutoff=0.85))


# --------------------------------------------------------------------------
# step 3: translations that combine several keys into fields

Translation = Callable[[_Conf], dict[str, object]]


def _listeners(conf: _Conf) -> dict[str, object]:
    changes: dict[str, object] = {}
    seen: dict[tuple[str, int], _Setting] = {}  # TCP and TLS listeners may not share an address
    for family, fieldname in (("listeners.tcp", "listeners"), ("listeners.ssl", "ssl_listeners")):
        if conf.value(family):  # listeners.tcp = none
            changes[fieldname] = ()
        elif members := conf.members(family):  # RabbitMQ's default stays if none is named
            changes[fieldname] = _named_listeners(members, seen)
    return changes


def _named_listeners(
    members: list[_Setting], seen: dict[tuple[str, int], _Setting]
) -> tuple[Listener, ...]:
    listeners: list[Listener] = []
    for setting in members:
        assert setting.name is not None
        host, port = typing.cast(tuple[str, int], setting.value)
        # a port-only listener ("") takes every address on its port
        other = next(
            (s for (h, p), s in seen.items() if p == port and (h == host or "" in (h, host))),
            None,
        )
        if other is not None and port != 0:
            raise setting.line.error(
                f"expected an address no other listener uses; {other.line.key} "
                f"({other.line.filename}:{other.line.lineno}) already listens on it"
            )
        seen[host, port] = setting
        listeners.append(Listener(setting.name, host, port))
    return tuple(listeners)


def _tls(conf: _Conf) -> dict[str, object]:
    """A TLS listener needs a certificate; checked here, so a bad file stops the broker now."""
    listener = next(iter(conf.members("listeners.ssl")), None)
    verify = conf.settings.get("ssl_options.verify")
    fail = conf.settings.get("ssl_options.fail_if_no_peer_cert")
    if listener is not None and not conf.value("listeners.ssl"):
        for key in ("ssl_options.certfile", "ssl_options.keyfile"):
            if conf.value(key) is None:
                raise listener.line.error(f"a TLS listener needs {key} (a PEM file)")
    if verify is not None and verify.value == "verify_peer":
        if conf.value("ssl_options.cacertfile") is None:
            raise verify.line.error(
                "verify_peer needs ssl_options.cacertfile (the CAs client certificates must "
                "chain to)"
            )
    elif fail is not None and fail.value is True:
        raise fail.line.error("true needs ssl_options.verify = verify_peer")
    return {}


def _default_permissions(conf: _Conf) -> dict[str, object]:
    # Settings keeps them in the order configure, write, read
    given = [conf.value(f"default_permissions.{kind}") for kind in ("configure", "write", "read")]
    defaults = Settings().default_permissions
    merged = tuple(d if g is None else g for g, d in zip(given, defaults, strict=True))
    return {"default_permissions": merged}


def _flags(family: str, none_key: str | None, fieldname: str) -> Translation:
    """``<family>.<name> = true|false`` entries; if any is given, the true ones
    replace the default, as in RabbitMQ; ``<none_key> = none`` clears them."""

    def translate(conf: _Conf) -> dict[str, object]:
        if none_key is not None and conf.value(none_key):
            return {fieldname: ()}
        members = conf.members(family)
        if not members:
            return {}
        return {fieldname: tuple(s.name for s in members if s.value is True)}

    return translate


def _permits(conf: _Conf) -> dict[str, object]:
    members = conf.members("deprecated_features.permit")
    if not members:
        return {}
    return {"deprecated_features_permit": tuple((s.name, s.value is True) for s in members)}


def _memory_watermark(conf: _Conf) -> dict[str, object]:
    # as in RabbitMQ, the absolute limit wins when both are set
    absolute = conf.value("vm_memory_high_watermark.absolute")
    relative = conf.value("vm_memory_high_watermark.relative")
    if absolute is not None:
        return {
            "vm_memory_high_watermark_absolute": absolute,
            "vm_memory_high_watermark_relative": None,
        }
    if relative is not None:
        return {
            "vm_memory_high_watermark_relative": relative,
            "vm_memory_high_watermark_absolute": None,
        }
    return {}


_TRANSLATIONS: tuple[Translation, ...] = (
    _listeners,
    _tls,
    _default_permissions,
    _flags("default_user_tags", None, "default_user_tags"),
    _flags("loopback_users", "loopback_users", "loopback_users"),
    _permits,
    _memory_watermark,
)


def _settings(conf: _Conf) -> Settings:
    changes: dict[str, object] = {}
    for key, spec in _KEYS.items():
        if spec.field is not None and key in conf.settings:
            changes[spec.field] = conf.settings[key].value
    # as cuttlefish's phases: translations only see a file whose lines all passed,
    # so one mistake does not show up again as a second, derived one
    if conf.errors:
        raise ConfigError.combine(conf.errors)
    errors: list[ConfigError] = []
    for translate in _TRANSLATIONS:
        try:
            changes.update(translate(conf))
        except ConfigError as exc:
            errors.append(exc)
    if errors:
        raise ConfigError.combine(errors)
    changes["ignored_keys"] = tuple(conf.ignored)
    changes["config_files"] = tuple(conf.files)
    return Settings().replace(**changes)


# --------------------------------------------------------------------------
# public API


def parse_config(text: str, filename: str = "<string>") -> Settings:
    """Settings from the text of one rabbitmq.conf, on top of the defaults."""
    conf = _Conf()
    conf.add(text, filename)
    return _settings(conf)


def load_settings(
    path: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, object] | None = None,
) -> Settings:
    """Settings as the broker starts with them.

    The file is ``path``, else ``$RABBITMQ_CONFIG_FILE``, else none (built-in
    defaults); after it, the ``conf.d/*.conf`` files in its directory are
    read in name order, later ones winning. Then ``RABBITMQ_DEFAULT_USER``,
    ``RABBITMQ_DEFAULT_PASS`` and ``RABBITMQ_DEFAULT_VHOST`` from
    ``environ`` (default: ``os.environ``), then ``overrides`` (Settings
    field name -> value, e.g. from the command line).
    """
    env = os.environ if environ is None else environ
    if path is None:
        path = env.get(ENV_CONFIG_FILE) or None
    conf = _Conf()
    if path is not None:
        for file in _config_files(Path(path)):
            conf.add(_read(file), str(file))
            conf.files.append(str(file))
    settings = _settings(conf)
    from_env = {field: env[name] for name, field in ENV_OVERRIDES.items() if env.get(name)}
    settings = settings.replace(**from_env)
    return _apply_overrides(settings, overrides or {})


def _config_files(main: Path) -> list[Path]:
    if main.suffix == ".config":
        raise ConfigError(
            "Erlang-term (.config) files are not supported; use the rabbitmq.conf format",
            filename=str(main),
        )
    if not main.exists() and not main.suffix and main.with_suffix(".conf").exists():
        main = main.with_suffix(".conf")  # RabbitMQ's old habit of adding .conf
    files = [main]
    conf_d = main.parent / "conf.d"
    if conf_d.is_dir():
        extra = [p for p in conf_d.glob("*.conf") if p.is_file() and not p.name.startswith(".")]
        files.extend(sorted(extra, key=lambda p: p.name))
    return files


def _read(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(
            f"cannot read the config file: {exc.strerror or exc}", filename=str(path)
        ) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        lineno = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError("expected UTF-8 text", filename=str(path), lineno=lineno) from None


_FIELD_TYPES: Mapping[str, object] = typing.get_type_hints(Settings)


def _apply_overrides(settings: Settings, overrides: Mapping[str, object]) -> Settings:
    for name, value in overrides.items():
        hint = _FIELD_TYPES.get(name)
        if hint is None:
            raise ConfigError(
                "unknown setting; expected a field of config.Settings",
                filename="<overrides>",
                key=name,
            )
        if not _has_type(value, hint):
            raise ConfigError(
                f"expected {_type_name(hint)}", filename="<overrides>", key=name, value=repr(value)
            )
    return settings.replace(**overrides)


def _has_type(value: object, hint: object) -> bool:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is types.UnionType or origin is typing.Union:
        return any(_has_type(value, arg) for arg in args)
    if hint is type(None):
        return value is None
    if origin is tuple:
        if not isinstance(value, tuple):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(_has_type(item, args[0]) for item in value)
        return len(args) == len(value) and all(map(_has_type, value, args))
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(hint, type) and isinstance(value, hint)


def _type_name(hint: object) -> str:
    return hint.__name__ if isinstance(hint, type) else str(hint)
