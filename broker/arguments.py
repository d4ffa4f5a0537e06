"""Validation of queue arguments, with RabbitMQ's 406 texts."""

from __future__ import annotations

from typing import Any

from protocol.constants import PRECONDITION_FAILED
from protocol.errors import ChannelError

MAX_UINT32 = 2**32 - 1

# arguments whose values must match on redeclare (RabbitMQ ignores others)
EQUIVALENCE_CHECKED = (
    "x-dead-letter-exchange",
    "x-dead-letter-routing-key",
    "x-expires",
    "x-max-length",
    "x-max-length-bytes",
    "x-max-priority",
    "x-message-ttl",
    "x-overflow",
    "x-queue-mode",
    "x-queue-type",
    "x-single-active-consumer",
    "x-delivery-limit",
    "x-consumer-timeout",
)

OVERFLOW_MODES = ("drop-head", "reject-publish", "reject-publish-dlx")
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


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _invalid(arg: str, queue: str, vhost: str, reason: str) -> ChannelError:
    return ChannelError(
        PRECONDITION_FAILED, f"invalid arg '{arg}' for queue '{queue}' in vhost '{vhost}': {reason}"
    )


def _non_negative(arg: str, value: Any, queue: str, vhost: str, maximum: int | None) -> None:
    if not _is_int(value):
        raise _invalid(arg, queue, vhost, f"{{unacceptable_type,{type_name(value)}}}")
    if value < 0:
        raise _invalid(arg, queue, vhost, f"{{value_negative,{value}}}")
    if maximum is not None and value > maximum:
        raise _invalid(arg, queue, vhost, f"{{value_too_large,{value},{maximum}}}")


def _positive(arg: str, value: Any, queue: str, vhost: str) -> None:
    _non_negative(arg, value, queue, vhost, MAX_UINT32)
    if value == 0:
        raise _invalid(arg, queue, vhost, "{value_zero,0}")


def validate_queue_arguments(args: dict[str, Any], queue: str, vhost: str) -> None:
    for arg, value in args.items():
        if arg == "x-message-ttl":
            _non_negative(arg, value, queue, vhost, MAX_UINT32)
        elif arg in ("x-expires", "x-consumer-timeout"):
            _positive(arg, value, queue, vhost)
        elif arg in ("x-max-length", "x-max-length-bytes"):
            _non_negative(arg, value, queue, vhost, None)
        elif arg == "x-max-priority":
            _non_negative(arg, value, queue, vhost, 255)
        elif arg == "x-overflow":
            if value not in OVERFLOW_MODES:
                raise _invalid(arg, queue, vhost, f"{{invalid_overflow_value,{value!r}}}")
        elif arg in ("x-dead-letter-exchange", "x-dead-letter-routing-key"):
            if not isinstance(value, str):
                raise _invalid(arg, queue, vhost, f"{{unacceptable_type,{type_name(value)}}}")
        elif arg == "x-queue-type":
            if value not in QUEUE_TYPES:
                raise _invalid(arg, queue, vhost, f"{{unsupported_queue_type,{value!r}}}")
        elif arg == "x-single-active-consumer" and not isinstance(value, bool):
            raise _invalid(arg, queue, vhost, f"{{unacceptable_type,{type_name(value)}}}")
    if "x-dead-letter-routing-key" in args and "x-dead-letter-exchange" not in args:
        raise ChannelError(
            PRECONDITION_FAILED,
            f"invalid arg 'x-dead-letter-routing-key' for queue '{queue}' in vhost '{vhost}': "
            "{no_dead_letter_exchange}",
        )


def describe(value: Any) -> str:
    if value is None:
        return "none"
    return f"the value '{_show(value)}' of type '{type_name(value)}'"


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def check_equivalent_arguments(
    current: dict[str, Any], received: dict[str, Any], queue: str, vhost: str
) -> None:
    for arg in EQUIVALENCE_CHECKED:
        have, got = current.get(arg), received.get(arg)
        if have == got and type_name(have) == type_name(got):
            continue
        if have is not None and got is not None and type_name(have) == type_name(got):
            detail = f"received '{_show(got)}' but current is '{_show(have)}'"
        else:
            detail = f"received {describe(got)} but current is {describe(have)}"
        raise ChannelError(
            PRECONDITION_FAILED,
            f"inequivalent arg '{arg}' for queue '{queue}' in vhost '{vhost}': {detail}",
        )
