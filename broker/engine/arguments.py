"""Validation of queue arguments, with RabbitMQ's 406 texts."""

from __future__ import annotations

from typing import Any

from warren.broker.engine.retry import RETRY_TYPES, RetryConfigError, parse_schedule
from warren.protocol.constants import PRECONDITION_FAILED
from warren.protocol.errors import ChannelError
from warren.protocol.tables import TypedTable

MAX_UINT32 = 2**32 - 1
# RabbitMQ's ceiling for TTLs and expiry (ten years, ms); Celery's delayed delivery needs more
# than 2^32 ms, so Warren takes RabbitMQ's limit rather than a 32-bit one
MAX_TTL = 315_360_000_000

# Arguments whose values must match on redeclare, by the existing queue's type, in the order
# RabbitMQ 4.3 checks them (rabbit_amqqueue:assert_args_equivalence/2 takes the type's
# capabilities() queue_arguments: rabbit_classic_queue, rabbit_quorum_queue,
# rabbit_stream_queue), so that the same argument is named. Warren's own arguments on a type
# that 4.3 does not give them follow.
_RETRY = ("x-delayed-retry-type", "x-delayed-retry-min", "x-delayed-retry-max")
_WARREN_RETRY = ("x-delayed-retry-multiplier", "x-delayed-retry-schedule")
EQUIVALENCE_CHECKED: dict[str, tuple[str, ...]] = {
    "classic": (
        "x-expires",
        "x-message-ttl",
        "x-dead-letter-exchange",
        "x-dead-letter-routing-key",
        "x-max-length",
        "x-max-length-bytes",
        "x-max-priority",
        "x-overflow",
        "x-queue-mode",
        "x-queue-version",
        "x-single-active-consumer",
        "x-queue-type",
        "x-queue-master-locator",
        "x-queue-leader-locator",
        # Warren's own on classic queues
        "x-delivery-limit",
        "x-consumer-timeout",
        *_RETRY,
        *_WARREN_RETRY,
    ),
    "quorum": (
        "x-dead-letter-exchange",
        "x-dead-letter-routing-key",
        "x-dead-letter-strategy",
        "x-expires",
        "x-max-length",
        "x-max-length-bytes",
        "x-max-in-memory-length",
        "x-max-in-memory-bytes",
        "x-overflow",
        "x-single-active-consumer",
        "x-queue-type",
        "x-quorum-initial-group-size",
        "x-delivery-limit",
        "x-message-ttl",
        "x-queue-leader-locator",
        "x-consumer-disconnected-timeout",
        "x-consumer-timeout",
        *_RETRY,
        *_WARREN_RETRY,
    ),
    "stream": (  # broker/streams/stream.py; RabbitMQ 4.3 rabbit_stream_queue:capabilities/0
        "x-max-length-bytes",
        "x-queue-type",
        "x-max-age",
        "x-stream-max-segment-size-bytes",
        "x-stream-filter-size-bytes",
        "x-initial-cluster-size",
        "x-queue-leader-locator",
    ),
}
# quorum_queue.property_equivalence.relaxed_checks_on_redeclaration: a quorum queue
# redeclared as classic is checked on these only (rabbit_amqqueue:
# perform_limited_equivalence_checks_on_qq_redeclaration/2)
RELAXED_CHECKED = (
    "x-dead-letter-exchange",
    "x-dead-letter-routing-key",
    "x-expires",
    "x-max-length",
    "x-max-length-bytes",
    "x-single-active-consumer",
    "x-message-ttl",
)

OVERFLOW_MODES = ("drop-head", "reject-publish", "reject-publish-dlx")
# Arguments of other queue types that a type refuses (rabbit_amqqueue:check_arguments_key/4:
# every type's queue_arguments but its own, 3.10 and 4.3 alike). Classic queues keep Warren's
# x-delivery-limit, x-consumer-timeout and x-delayed-retry-* (README, "Where Warren differs").
_KNOWN = {arg for args in EQUIVALENCE_CHECKED.values() for arg in args} - set(_WARREN_RETRY)
REFUSED_BY_TYPE: dict[str, frozenset[str]] = {
    "classic": frozenset(_KNOWN - set(EQUIVALENCE_CHECKED["classic"])),
    "quorum": frozenset(_KNOWN - set(EQUIVALENCE_CHECKED["quorum"])),
}
QUEUE_TYPES = ("classic", "quorum")


def type_name(value: Any) -> str:
    """The field type RabbitMQ names in its texts."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "long"
    if isinstance(value, str | bytes):
        return "longstr"
    if isinstance(value, float):
        return "double"
    if isinstance(value, dict):
        return "table"
    if isinstance(value, list):
        return "array"
    return "void" if value is None else type(value).__name__


def is_int(value: Any) -> bool:
    """An AMQP integer: Python's bool is an int, but a field-table boolean is not one."""
    return isinstance(value, int) and not isinstance(value, bool)


def _invalid(arg: str, queue: str, vhost: str, reason: str) -> ChannelError:
    return ChannelError(
        PRECONDITION_FAILED, f"invalid arg '{arg}' for queue '{queue}' in vhost '{vhost}': {reason}"
    )


def _non_negative(
    arg: str, value: Any, queue: str, vhost: str, maximum: int | None, kind: str = ""
) -> None:
    if not is_int(value):
        raise _invalid(arg, queue, vhost, f'"expected integer, got {kind or type_name(value)}"')
    if value < 0:
        raise _invalid(arg, queue, vhost, f"{{value_negative,{value}}}")
    if maximum is not None and value > maximum:
        raise _invalid(arg, queue, vhost, f"{{value_too_large,{value}}}")


def _positive(arg: str, value: Any, queue: str, vhost: str, kind: str = "") -> None:
    _non_negative(arg, value, queue, vhost, MAX_TTL, kind)
    if value == 0:
        raise _invalid(arg, queue, vhost, "{value_zero,0}")


def validate_queue_arguments(
    args: dict[str, Any],
    queue: str,
    vhost: str,
    *,
    durable: bool = True,
    exclusive: bool = False,
    auto_delete: bool = False,
) -> None:
    """Refuse a declaration RabbitMQ would refuse, naming the argument and the value."""
    dlx = args.get("x-dead-letter-exchange")
    if dlx is not None and not isinstance(dlx, str):  # RabbitMQ checks this one first, so worded
        raise ChannelError(
            PRECONDITION_FAILED,
            f"invalid type '{wire_type(args, 'x-dead-letter-exchange')}' for arg "
            f"'x-dead-letter-exchange' in queue '{queue}' in vhost '{vhost}'",
        )
    for arg, value in args.items():
        kind = wire_type(args, arg)  # the field type as sent: 'byte', 'float', 'timestamp' ...
        if arg == "x-message-ttl":
            _non_negative(arg, value, queue, vhost, MAX_TTL, kind)
        elif arg in ("x-expires", "x-consumer-timeout"):
            _positive(arg, value, queue, vhost, kind)
        elif arg in (
            "x-max-length",
            "x-max-length-bytes",
            "x-delayed-retry-min",
            "x-delayed-retry-max",
        ):
            _non_negative(arg, value, queue, vhost, None, kind)
        elif arg == "x-max-priority":
            _non_negative(arg, value, queue, vhost, None, kind)
            if value > 255:
                raise _invalid(arg, queue, vhost, f"{{max_value_exceeded,{value}}}")
        elif arg == "x-delivery-limit":
            if not is_int(value):
                raise _invalid(arg, queue, vhost, f'"expected integer, got {kind}"')
        elif arg == "x-queue-version":
            # RabbitMQ 4.x (rabbit_amqqueue:check_queue_version/2): classic queues are v2 only
            _non_negative(arg, value, queue, vhost, None, kind)
            if value != 2:
                raise _invalid(arg, queue, vhost, f"\"unsupported queue version '{value}'\"")
        elif arg == "x-delayed-retry-multiplier":
            _positive(arg, value, queue, vhost, kind)
        elif arg == "x-delayed-retry-type":
            if value not in RETRY_TYPES:
                raise _invalid(
                    arg, queue, vhost, f"{value!r} is not one of {', '.join(RETRY_TYPES)}"
                )
        elif arg == "x-delayed-retry-schedule":
            if not isinstance(value, str):
                raise _invalid(arg, queue, vhost, f'"expected a string, got {kind}"')
            try:
                parse_schedule(value)
            except RetryConfigError as exc:
                raise _invalid(arg, queue, vhost, str(exc)) from None
        elif arg == "x-overflow":
            if value not in OVERFLOW_MODES:
                raise _invalid(arg, queue, vhost, f"{{invalid_overflow,{_show(value)!r}}}")
        elif arg in ("x-dead-letter-exchange", "x-dead-letter-routing-key"):
            if not isinstance(value, str):
                raise _invalid(arg, queue, vhost, f"{{unacceptable_type,{kind}}}")
        elif arg == "x-queue-type":
            if value not in QUEUE_TYPES:
                raise _invalid(arg, queue, vhost, f"\"unsupported queue type '{value}'\"")
        elif arg == "x-single-active-consumer" and not isinstance(value, bool):
            raise _invalid(arg, queue, vhost, f"{{unacceptable_type,{kind}}}")
    if "x-dead-letter-routing-key" in args and "x-dead-letter-exchange" not in args:
        raise _invalid("x-dead-letter-routing-key", queue, vhost, "routing_key_but_no_dlx_defined")
    queue_type = args.get("x-queue-type", "classic")
    refused = REFUSED_BY_TYPE.get(queue_type, frozenset())
    for arg in args:  # in the order sent, as check_arguments_key/4
        if arg in refused:
            raise ChannelError(
                PRECONDITION_FAILED,
                f"invalid arg '{arg}' for queue '{queue}' in vhost '{vhost}' of queue type "
                f"rabbit_{queue_type}_queue",
            )
    if queue_type == "quorum":
        # a quorum queue is durable, not exclusive and not auto-delete, checked in the order of
        # rabbit_quorum_queue:declare/2 (4.3): an exclusive queue, made transient by the
        # declare, is named for its exclusivity
        for bad, name in (
            (auto_delete, "auto-delete"),
            (exclusive, "exclusive-owner"),
            (not durable, "non-durable"),
        ):
            if bad:
                raise ChannelError(
                    PRECONDITION_FAILED,
                    f"invalid property '{name}' for queue '{queue}' in vhost '{vhost}'",
                )


def validate_consumer_arguments(args: dict[str, Any], queue: str, vhost: str) -> None:
    priority = args.get("x-priority")
    if priority is not None and not is_int(priority):
        raise _invalid("x-priority", queue, vhost, f'"expected integer, got {type_name(priority)}"')
    timeout = args.get("x-consumer-timeout")
    if timeout is not None:
        _positive("x-consumer-timeout", timeout, queue, vhost)


def wire_type(table: dict[str, Any], key: str) -> str:
    """The field type of ``table[key]`` as sent (TypedTable), else as Python suggests."""
    if isinstance(table, TypedTable) and key in getattr(table, "types", {}):
        return table.types[key]
    return type_name(table.get(key))


def _describe(table: dict[str, Any], key: str) -> str:
    if key not in table:
        return "none"
    return f"the value '{_show(table[key])}' of type '{wire_type(table, key)}'"


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


_INTEGER_TYPES = {
    "signedint",
    "unsignedint",
    "long",
    "byte",
    "unsignedbyte",
    "short",
    "unsignedshort",
}


def _kind(wire: str) -> str:
    """Integer widths do not matter for equivalence (RabbitMQ compares the numbers)."""
    return "integer" if wire in _INTEGER_TYPES else wire


def check_equivalent_arguments(
    current: dict[str, Any],
    received: dict[str, Any],
    queue: str,
    vhost: str,
    checked: tuple[str, ...] = EQUIVALENCE_CHECKED["classic"],
) -> None:
    """RabbitMQ compares type and value of the arguments its queue type knows
    (rabbit_misc:assert_args_equivalence/4)."""
    for arg in checked:
        if arg not in current and arg not in received:
            continue
        have_type, got_type = wire_type(current, arg), wire_type(received, arg)
        if arg in current and arg in received:
            if _kind(have_type) == _kind(got_type) and current[arg] == received[arg]:
                continue
            detail = f"received '{_show(received[arg])}' but current is '{_show(current[arg])}'"
        else:
            if arg == "x-queue-type" and _is_classic(current if arg in current else received):
                # rabbit_misc:assert_field_equivalence/4: a queue without x-queue-type (one
                # from before 4.x) is classic, and a classic one matches a declare without it
                continue
            detail = f"received {_describe(received, arg)} but current is {_describe(current, arg)}"
        raise ChannelError(
            PRECONDITION_FAILED,
            f"inequivalent arg '{arg}' for queue '{queue}' in vhost '{vhost}': {detail}",
        )


def _is_classic(table: dict[str, Any]) -> bool:
    return table.get("x-queue-type") == "classic" and wire_type(table, "x-queue-type") == "longstr"
