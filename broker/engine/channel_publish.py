"""basic.publish on a channel: checks, routing, and the confirm each publish is owed.

``basic_publish`` checks the publish (permissions, the exchange, user-id, expiration,
direct reply-to) and hands it to ``route``, or to the channel's transaction; ``route``
routes it through the vhost, enqueues it, returns it if it is mandatory and unroutable,
and hands its routing the channel's confirm token (``Confirms.route``), on which the store
counts the copies it takes to write; ``Confirms.routed`` then says whether the confirm goes
at once, waits for the disk, or is a nack. The store reports to ``Confirms`` itself;
scheduling and writing the frames are the channel's (``Channel.confirms_due``,
``Channel.flush_confirms``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pamqp import commands

from warren.broker.engine import reply_to
from warren.broker.engine.arguments import MAX_TTL
from warren.broker.engine.confirms import DUE, NACKED
from warren.broker.engine.message import Message, routing_headers
from warren.broker.engine.queue import fan_out
from warren.broker.engine.stats import SIZE_BOUNDS, SIZE_BUCKET_BY_BITS
from warren.broker.tracing import firehose
from warren.protocol.connection import Content
from warren.protocol.constants import (
    ACCESS_REFUSED,
    NO_ROUTE,
    NOT_FOUND,
    NOT_IMPLEMENTED,
    PRECONDITION_FAILED,
    SYNTAX_ERROR,
)
from warren.protocol.errors import ChannelError, ConnectionError_
from warren.protocol.frames import content_frames
from warren.protocol.methods import return_frame
from warren.protocol.properties import (
    FLAG_EXPIRATION,
    FLAG_HEADERS,
    FLAG_REPLY_TO,
    FLAG_USER_ID,
    decode_field,
    encode_shortstr,
    join_properties,
    split_properties,
)

if TYPE_CHECKING:
    from warren.broker.engine.channel import Channel
    from warren.broker.engine.exchange import Exchange
    from warren.broker.engine.vhost import VirtualHost


def basic_publish(ch: Channel, content: Content) -> None:
    method = content.method
    if method.immediate:
        raise ConnectionError_(NOT_IMPLEMENTED, "immediate=true", 60, 40)
    stats = ch.stats
    stats.received += 1
    size = len(content.body)
    # rabbitmq_message_size_bytes' bucket: by bit length, then one step down if it fits
    bucket = SIZE_BUCKET_BY_BITS[size.bit_length()]
    if bucket and size <= SIZE_BOUNDS[bucket - 1]:
        bucket -= 1
    if bucket != stats.run_bucket:
        stats.switch_bucket(bucket)
    stats.run += 1
    stats.size_sum += size
    exchange = ch.publish_exchange
    if (
        method is not ch.last_publish
        or ch.allowed_version != ch.conn.access_changes.n
        or exchange is None
        or exchange.deleted
    ):
        if (
            method.exchange != ch.published_to
            or ch.allowed_version != ch.conn.access_changes.n
        ):  # fmt: skip
            ch.allow("write", "exchange", method.exchange or "amq.default")
            ch.published_to = method.exchange  # allow() brought allowed_version up to date
            access = ch.conn.broker.access
            ch.topic_rule = access.topic_rule(ch.conn.user, ch.vhost.name, method.exchange)
        exchange = publish_target(ch.vhost, method.exchange)
        # the next publish with this method (the protocol's, while the exchange, routing
        # key and bits repeat) skips the look-ups while the exchange is not deleted and
        # the permissions have not changed
        ch.publish_exchange = exchange
        ch.last_publish = method
        ch.publish_reply = not method.exchange and method.routing_key.startswith(
            reply_to.REPLY_TO_PREFIX
        )
    props = content.properties
    flags = (props[0] << 8) | props[1]
    sender_keys = None
    # "CC" or "BCC" somewhere in the headers? (find: about half the cost of ``in`` here)
    if flags & FLAG_HEADERS and props.find(b"CC") >= 0:
        props, sender_keys = routing_headers(props)
    if ch.topic_rule is not None and exchange.kind == "topic":
        ch.topic_rule.check_publish(method.routing_key, sender_keys)
    ttl = None
    if flags & (FLAG_EXPIRATION | FLAG_USER_ID | FLAG_REPLY_TO):
        ttl, props = _check_properties(ch, props)
    if (intercept := ch.conn.intercept) is not None:
        props = intercept(props)  # rabbit_msg_interceptor:intercept_incoming/2
    # the short strings as received: never encoded again (compiled, the length of bytes
    # is read in place; their truth is a generic call)
    ex_rk = method.ex_rk if len(method.ex_rk) else None
    msg = Message(method.exchange, method.routing_key, props, content.body, ex_rk)
    if sender_keys is not None:
        msg.sender_keys = sender_keys
    if ch.publish_reply:  # to the default exchange, a routing key amq.rabbitmq.reply-to.*
        exchange.published += 1
        reply_to.publish(ch, exchange, msg)
        return
    if ch.tx:
        ch.tx_publishes.append((exchange, msg, method.mandatory, ttl))
        return
    seq = ch.confirms.published() if ch.confirm else 0
    route(ch, exchange, msg, method.mandatory, ttl, seq)


def confirm_select(ch: Channel, method: commands.Confirm.Select) -> None:
    if ch.tx:
        raise ChannelError(PRECONDITION_FAILED, "cannot switch from tx to confirm mode")
    ch.confirm = True
    if not method.nowait:
        ch.reply(commands.Confirm.SelectOk())


def _check_properties(ch: Channel, props: bytes) -> tuple[int | None, bytes]:
    """Validate user-id and expiration; point a direct reply-to at this channel."""
    try:
        fields = split_properties(props)
    except ValueError as exc:
        text = f"content header properties: {exc}"
        raise ConnectionError_(SYNTAX_ERROR, text, 60, 40) from None
    asked = fields.get("reply_to")
    if asked is not None and decode_field("reply_to", asked) == reply_to.REPLY_TO:
        if ch.reply_tag is None:
            raise ChannelError(PRECONDITION_FAILED, "fast reply consumer does not exist")
        fields["reply_to"] = encode_shortstr(reply_to.REPLY_TO_PREFIX + ch.reply_token)
        props = join_properties(fields)
    return checked_ttl(fields, ch.conn.user), props


def publish_target(vhost: VirtualHost, name: str) -> Exchange:
    """The exchange a publish names, the management API's publish too: it must exist and
    not be internal."""
    exchange = vhost.exchanges.get(name)
    if exchange is None:
        raise ChannelError(NOT_FOUND, f"no exchange '{name}' in vhost '{vhost.name}'")
    if exchange.internal:
        raise ChannelError(
            ACCESS_REFUSED, f"cannot publish to internal exchange '{name}' in vhost '{vhost.name}'"
        )
    return exchange


def checked_ttl(fields: dict[str, bytes], user: str) -> int | None:
    """basic.publish's checks on properties, the management API's publish too: user-id
    must be the authenticated user; the expiration property parsed (None: none)."""
    user_id = fields.get("user_id")
    if user_id is not None:
        claimed = decode_field("user_id", user_id)
        if claimed != user:
            raise ChannelError(
                PRECONDITION_FAILED,
                f"user_id property set to '{claimed}' but authenticated user was '{user}'",
            )
    expiration = fields.get("expiration")
    if expiration is None:
        return None
    return parse_expiration(decode_field("expiration", expiration))


def parse_expiration(value: str) -> int:
    """RabbitMQ's reading of the expiration property (Erlang's string:to_integer)."""
    digits = value[1:] if value[:1] in "+-" else value
    n = 0
    while n < len(digits) and digits[n].isdigit():
        n += 1
    if n == 0:
        raise ChannelError(PRECONDITION_FAILED, f"invalid expiration '{value}': no_integer")
    number = int(value[: len(value) - len(digits) + n])
    leftover = digits[n:]
    if leftover:
        raise ChannelError(
            PRECONDITION_FAILED, f"invalid expiration '{value}': {{leftover_string,\"{leftover}\"}}"
        )
    if number < 0:
        raise ChannelError(
            PRECONDITION_FAILED, f"invalid expiration '{value}': {{value_negative,{number}}}"
        )
    if number > MAX_TTL:
        raise ChannelError(
            PRECONDITION_FAILED, f"invalid expiration '{value}': {{value_too_large,{number}}}"
        )
    return number


def route(
    ch: Channel, exchange: Exchange, msg: Message, mandatory: bool, ttl: int | None, seq: int
) -> None:
    exchange.published += 1  # exchange_messages_published_total
    store = ch.store
    # x-delayed-message keeps a delayed message back: no queue now, as the plugin
    delay = exchange.delay(msg) if exchange.delays else 0
    queues = [] if delay else ch.vhost.route(exchange, msg)
    if (tracer := ch.vhost.tracer) is not None:
        tracer.published(ch, msg, queues, mandatory, seq)
        if delay:
            tracer.delayed(msg, exchange.name, delay)
        if tracer.firehose.bindings:
            firehose.published(tracer.firehose, ch, msg, queues)
    # the token the store counts this publish's stored copies on (broker/engine/confirms.py);
    # without a store of the broker's, a stream's private store still counts its chunks on it
    confirm = ch.confirms.route(seq) if seq else None
    if delay:
        exchange.hold(msg, ttl, delay, confirm)
    accepted = True
    if queues:
        ch.stats.routed += 1
        if len(queues) == 1:  # the usual case, without fan_out's call (hot path)
            accepted = queues[0].publish(msg, ttl, confirm)
        else:
            accepted = fan_out(queues, msg, ttl, confirm) == len(queues)
    elif mandatory:
        ch.stats.unroutable_returned += 1
        exchange.unroutable_returned += 1
        ch.conn.write(return_frame(ch.id, NO_ROUTE, "NO_ROUTE", msg.ex_rk))
        ch.conn.write_many(
            content_frames(ch.id, msg.properties, msg.body, ch.conn.protocol.frame_max)
        )
    else:
        ch.stats.unroutable_dropped += 1
        exchange.unroutable_dropped += 1
    if seq:
        if exchange is not ch.confirmed_by_exchange.last:
            ch.confirmed_by_exchange.switch(seq, exchange)
        confirms = ch.confirms
        outcome = confirms.routed(seq, accepted, store)
        if outcome == NACKED:
            ch.flush_confirms()
        elif outcome == DUE:
            ch.conn.pending_confirms.add(ch)
        else:
            limit = ch.max_unconfirmed
            # waiting() is at most the unconfirmed count: mostly that bound settles it
            if (
                limit is not None
                and seq - confirms.confirmed > limit
                and confirms.waiting() > limit
            ):
                ch.conn.hold(ch)  # this one is taken, the next waits for the disk
