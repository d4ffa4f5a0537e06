"""A queue's effective settings from its arguments, its policy and the operator policy
(RabbitMQ's rabbit_amqqueue_process:process_args_policy, with rabbit_policy's merge):
TTLs, expiry, length limits and overflow, dead-lettering, the delivery limit, delayed retry
and the consumer timeout. Run when a queue is declared and when its policies change."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from warren.broker.engine.retry import RetryPolicy, parse_schedule

if TYPE_CHECKING:
    from warren.broker.engine.queue import Queue


def resolve_settings(queue: Queue) -> None:
    """Set ``queue``'s effective settings (the attributes Queue declares for them)."""
    args = queue.arguments
    definition = queue.effective_definition()

    queue.message_ttl = _smallest(args, definition, "x-message-ttl", "message-ttl")
    queue.expires = _smallest(args, definition, "x-expires", "expires")
    queue.max_length = _smallest(args, definition, "x-max-length", "max-length")
    queue.max_length_bytes = _smallest(args, definition, "x-max-length-bytes", "max-length-bytes")
    overflow = _first(args, definition, "x-overflow", "overflow")
    queue.overflow = overflow if isinstance(overflow, str) else "drop-head"
    dlx = _first(args, definition, "x-dead-letter-exchange", "dead-letter-exchange")
    queue.dead_letter_exchange = dlx if isinstance(dlx, str) else None
    dlrk = _first(args, definition, "x-dead-letter-routing-key", "dead-letter-routing-key")
    queue.dead_letter_routing_key = dlrk if isinstance(dlrk, str) else None
    queue._limited = queue.max_length is not None or queue.max_length_bytes is not None
    limits: list[int] = [
        v
        for v in (args.get("x-delivery-limit"), definition.get("delivery-limit"))
        if isinstance(v, int) and not isinstance(v, bool)
    ]
    # RabbitMQ 4 (resolve_delivery_limit): the smaller, but -1 (none) loses to any limit
    limit = (max(limits) if min(limits) < 0 else min(limits)) if limits else None
    if limit is None and queue.queue_type == "quorum":
        limit = 20  # RabbitMQ 4.0+ default for quorum queues
    queue.delivery_limit = None if limit is None or limit < 0 else limit
    queue.retry = retry_policy(args, definition)
    queue.counts_deliveries = queue.queue_type == "quorum" or queue.retry.enabled
    queue.consumer_timeout_setting = _smallest(
        args, definition, "x-consumer-timeout", "consumer-timeout"
    )
    for consumer in queue.consumers:
        consumer.timeout = queue.consumer_timeout_for(consumer.arguments)


def _smallest(args: dict[str, Any], definition: dict[str, Any], arg: str, key: str) -> int | None:
    """The smaller of the argument and the policy's key (RabbitMQ's for limits and TTLs).
    Module functions, not closures: a compiled closure's environment is a reference cycle
    that outlives a deleted queue until the cyclic collector runs."""
    values = [
        v
        for v in (args.get(arg), definition.get(key))
        if isinstance(v, int) and not isinstance(v, bool)
    ]
    return min(values) if values else None


def _first(args: dict[str, Any], definition: dict[str, Any], arg: str, key: str) -> Any:
    """The argument if the queue has it, else the policy's key."""
    return args[arg] if arg in args else definition.get(key)


def retry_policy(args: dict[str, Any], definition: dict[str, Any]) -> RetryPolicy:
    """The delayed-retry settings; a queue argument wins over the policy key."""

    kind = _first(args, definition, "x-delayed-retry-type", "delayed-retry-type")
    schedule = _first(args, definition, "x-delayed-retry-schedule", "delayed-retry-schedule")
    max_ms = _first(args, definition, "x-delayed-retry-max", "delayed-retry-max")
    multiplier = _first(args, definition, "x-delayed-retry-multiplier", "delayed-retry-multiplier")
    return RetryPolicy(
        kind=kind if isinstance(kind, str) else "disabled",
        min_ms=_first(args, definition, "x-delayed-retry-min", "delayed-retry-min") or 0,
        max_ms=max_ms if isinstance(max_ms, int) else None,
        multiplier=multiplier if isinstance(multiplier, int) else None,
        schedule=parse_schedule(schedule) if isinstance(schedule, str) else (),
    )
