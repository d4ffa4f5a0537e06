"""Declaring what may already exist: the arguments a queue.declare is taken with, and whether
a redeclare is equivalent to what exists (406 PRECONDITION_FAILED, naming the argument, if
not). RabbitMQ 4.3's rabbit_amqqueue:augment_declare_args/5, rabbit_amqqueue:assert_equivalence/5
and rabbit_exchange:assert_equivalence/6; the vhost's declare_queue and declare_exchange ask.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from warren.broker.engine.arguments import (
    EQUIVALENCE_CHECKED,
    RELAXED_CHECKED,
    check_equivalent_arguments,
)
from warren.protocol.constants import PRECONDITION_FAILED
from warren.protocol.errors import ChannelError
from warren.protocol.tables import TypedTable

if TYPE_CHECKING:
    from warren.broker.engine.exchange import Exchange
    from warren.broker.engine.queue import Queue
    from warren.broker.engine.vhost import VirtualHost


def augment_declare_args(
    vhost: VirtualHost, arguments: dict[str, Any], durable: bool, exclusive: bool, auto_delete: bool
) -> dict[str, Any]:
    """RabbitMQ 4.3's rabbit_amqqueue:augment_declare_args/5, on every queue.declare that
    is not passive (AMQP, management API, definitions): without ``x-queue-type`` a queue
    gets the vhost's default type where that type fits it (quorum and stream: durable,
    not exclusive, not auto-delete; a transient non-exclusive queue also needs
    ``transient_nonexcl_queues`` permitted), else ``classic``. ``classic`` is written too,
    so the stored arguments, the API and the definitions show it."""
    if arguments.get("x-queue-type") in ("", "undefined"):
        # 4.3 (rabbit_amqqueue:get_queue_type/2) takes these as the vhost's default type,
        # without the fit check below; Warren stores the type taken, not the text sent
        typed = TypedTable(arguments)
        typed.types = {**getattr(arguments, "types", {}), "x-queue-type": "longstr"}
        typed["x-queue-type"] = vhost.default_queue_type
        return typed
    if "x-queue-type" in arguments:
        return arguments
    queue_type = vhost.default_queue_type
    permitted = durable or exclusive
    if not permitted and vhost.deprecated is not None:
        permitted = vhost.deprecated.is_permitted("transient_nonexcl_queues")
    fits = queue_type == "classic" or (durable and not exclusive and not auto_delete)
    typed = TypedTable(arguments)
    typed.types = {**getattr(arguments, "types", {}), "x-queue-type": "longstr"}
    typed["x-queue-type"] = queue_type if permitted and fits else "classic"
    return typed


def assert_queue_equivalence(
    vhost: VirtualHost,
    existing: Queue,
    durable: bool,
    exclusive: bool,
    auto_delete: bool,
    arguments: dict[str, Any],
    connection: object,
) -> None:
    """rabbit_amqqueue:assert_equivalence/5 with the augmented arguments."""
    if (
        vhost.relaxed_quorum_redeclare
        and existing.arguments.get("x-queue-type") == "quorum"
        and arguments.get("x-queue-type") == "classic"
    ):
        # equivalence_check_level/2: relaxed_checks, a few arguments and nothing else
        check_equivalent_arguments(
            existing.arguments, arguments, existing.name, vhost.name, RELAXED_CHECKED
        )
        return
    vhost.check_exclusive(existing, connection)
    if exclusive != (existing.exclusive_owner is not None):
        raise vhost.locked(existing)  # RabbitMQ: an exclusive mismatch is 405 too
    where = f"for queue '{existing.name}' {vhost.where()}"
    for arg, got, have in (
        ("durable", durable, existing.durable),
        ("auto_delete", auto_delete, existing.auto_delete),
    ):
        if got != have:
            raise ChannelError(
                PRECONDITION_FAILED,
                f"inequivalent arg '{arg}' {where}: received '{_bool(got)}' "
                f"but current is '{_bool(have)}'",
            )
    checked = EQUIVALENCE_CHECKED.get(existing.queue_type, EQUIVALENCE_CHECKED["classic"])
    check_equivalent_arguments(existing.arguments, arguments, existing.name, vhost.name, checked)


def assert_exchange_equivalence(
    vhost: VirtualHost,
    existing: Exchange,
    kind: str,
    durable: bool,
    auto_delete: bool,
    internal: bool,
    arguments: dict[str, Any],
) -> None:
    where = f"for exchange '{existing.name}' {vhost.where()}"
    checks = (
        ("type", kind, existing.kind),
        ("durable", _bool(durable), _bool(existing.durable)),
        ("auto_delete", _bool(auto_delete), _bool(existing.auto_delete)),
        ("internal", _bool(internal), _bool(existing.internal)),
    )
    for arg, got, have in checks:
        if got != have:
            raise ChannelError(
                PRECONDITION_FAILED,
                f"inequivalent arg '{arg}' {where}: received '{got}' but current is '{have}'",
            )
    got_ae = arguments.get("alternate-exchange")
    have_ae = existing.arguments.get("alternate-exchange")
    if got_ae != have_ae:
        raise ChannelError(
            PRECONDITION_FAILED,
            f"inequivalent arg 'alternate-exchange' {where}: "
            f"received {_describe(got_ae)} but current is {_describe(have_ae)}",
        )


def _bool(value: bool) -> str:
    return "true" if value else "false"


def _describe(value: Any) -> str:
    if value is None:
        return "none"
    return f"the value '{value}' of type 'longstr'"
