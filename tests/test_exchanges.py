"""Exchanges: types and routing, declaration rules, bindings, deletion, odd names."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
from amqp_raw import Janitor, RawClient, build, fv, header_payload, header_with_table, raw_table
from pamqp import commands

DEFAULT_EXCHANGE_REFUSED = "ACCESS_REFUSED - operation not permitted on the default exchange"


@pytest.fixture
def janitor(amqp_addr: tuple[str, int]) -> Iterator[Janitor]:
    j = Janitor(amqp_addr)
    yield j
    j.clean()


@pytest.fixture
def client(amqp_addr: tuple[str, int]) -> Iterator[RawClient]:
    c = RawClient.connect(amqp_addr)
    c.confirm_select(1)
    yield c
    c.close()


def not_found(kind: str, name: str) -> str:
    return f"NOT_FOUND - no {kind} '{name}' in vhost '/'"


def queues_for(c: RawClient, janitor: Janitor, prefix: str, n: int) -> list[str]:
    names = [janitor.queue(f"{prefix}.q{i}") for i in range(n)]
    for q in names:
        c.declare_queue(1, q, durable=True)
    return names


# -- routing ------------------------------------------------------------------


def test_direct_routing(client: RawClient, janitor: Janitor, name: str) -> None:
    ex = janitor.exchange(name)
    client.declare_exchange(1, ex, "direct")
    qa, qb, qab = queues_for(client, janitor, name, 3)
    client.bind_queue(1, qa, ex, "a")
    client.bind_queue(1, qb, ex, "b")
    client.bind_queue(1, qab, ex, "a")
    client.bind_queue(1, qab, ex, "b")
    client.bind_queue(1, qab, ex, "a")  # duplicate binding is a no-op
    for key in ("a", "b", "c", "A", ""):
        client.publish(1, key.encode(), exchange=ex, routing_key=key)
    assert client.wait_for_confirms(1) == dict.fromkeys(range(1, 6), True)
    assert client.drain(1, qa) == [b"a"]
    assert client.drain(1, qb) == [b"b"]
    assert client.drain(1, qab) == [b"a", b"b"]


def test_fanout_ignores_routing_key(client: RawClient, janitor: Janitor, name: str) -> None:
    ex = janitor.exchange(name)
    client.declare_exchange(1, ex, "fanout")
    q1, q2 = queues_for(client, janitor, name, 2)
    client.bind_queue(1, q1, ex, "")
    client.bind_queue(1, q2, ex, "whatever")
    client.bind_queue(1, q2, ex, "another")  # still one copy per queue
    client.publish(1, b"m1", exchange=ex, routing_key="k")
    client.publish(1, b"m2", exchange=ex, routing_key="")
    client.wait_for_confirms(1)
    assert client.drain(1, q1) == [b"m1", b"m2"]
    assert client.drain(1, q2) == [b"m1", b"m2"]


TOPIC_KEYS = ["", "a", "b", "a.b", "a.x.b", "a.b.b", "a..b", ".", "a.", ".a", "a.x.y.b", "x.y",
              "..", "a.b.c"]  # fmt: skip
ALL_KEYS = TOPIC_KEYS
ALL_BUT_EMPTY = TOPIC_KEYS[1:]
TOPIC_MATCHES: dict[str, list[str]] = {
    "*": ["a", "b"],
    "#": ALL_KEYS,
    "": [""],
    "a.*": ["a.b", "a."],
    "a.#": ["a", "a.b", "a.x.b", "a.b.b", "a..b", "a.", "a.x.y.b", "a.b.c"],
    "#.b": ["b", "a.b", "a.x.b", "a.b.b", "a..b", "a.x.y.b"],
    "a.#.b": ["a.b", "a.x.b", "a.b.b", "a..b", "a.x.y.b"],
    "a.#.#.b": ["a.b", "a.x.b", "a.b.b", "a..b", "a.x.y.b"],
    "*.#": ALL_BUT_EMPTY,
    "#.*": ALL_BUT_EMPTY,
    "#.#": ALL_KEYS,
    "a..b": ["a..b"],
    "a.*.b": ["a.x.b", "a.b.b", "a..b"],
    "*.*": ["a.b", ".", "a.", ".a", "x.y"],
    "*.*.*": ["a.x.b", "a.b.b", "a..b", "..", "a.b.c"],
    "a.b": ["a.b"],
    "*.b.#": ["a.b", "a.b.b", "a.b.c"],
}


def test_topic_routing(client: RawClient, janitor: Janitor, name: str) -> None:
    """Words are separated by '.', an empty key has no words, '*' is exactly
    one (possibly empty) word and '#' is zero or more words."""
    ex = janitor.exchange(name)
    client.declare_exchange(1, ex, "topic")
    patterns = list(TOPIC_MATCHES)
    queues = queues_for(client, janitor, name, len(patterns))
    for q, pattern in zip(queues, patterns, strict=True):
        client.bind_queue(1, q, ex, pattern)
    for key in TOPIC_KEYS:
        client.publish(1, key.encode(), exchange=ex, routing_key=key)
    client.wait_for_confirms(1)
    got = {
        p: [b.decode() for b in client.drain(1, q)] for q, p in zip(queues, patterns, strict=True)
    }
    assert got == TOPIC_MATCHES


def test_topic_one_copy_per_queue(client: RawClient, janitor: Janitor, name: str) -> None:
    ex = janitor.exchange(name)
    client.declare_exchange(1, ex, "topic")
    (q,) = queues_for(client, janitor, name, 1)
    for pattern in ("a.*", "#", "*.b", "a.b"):
        client.bind_queue(1, q, ex, pattern)
    client.publish(1, b"once", exchange=ex, routing_key="a.b")
    client.wait_for_confirms(1)
    assert client.drain(1, q) == [b"once"]


def S(value: str) -> bytes:
    return fv("S", value)


HEADER_BINDINGS: dict[str, list[tuple[str, bytes]]] = {
    "all_a1_bx": [("x-match", S("all")), ("a", fv("b", 1)), ("b", S("x"))],
    "any_a1_bx": [("x-match", S("any")), ("a", fv("b", 1)), ("b", S("x"))],
    "empty": [],
    "default_is_all": [("a", fv("b", 1))],
    "all_with_x": [("x-match", S("all-with-x")), ("x-k", S("v")), ("a", fv("b", 1))],
    "any_with_x": [("x-match", S("any-with-x")), ("x-k", S("v"))],
    "all_a_str1": [("x-match", S("all")), ("a", S("1"))],
    "any_only_x_keys": [("x-match", S("any")), ("x-k", S("v"))],
    "all_only_x_keys": [("x-match", S("all")), ("x-k", S("v"))],
    "all_a_void": [("x-match", S("all")), ("a", fv("V"))],
    "all_a_long1": [("x-match", S("all")), ("a", fv("l", 1))],
    "all_a_true": [("x-match", S("all")), ("a", fv("t", 1))],
    "all_f_double1": [("x-match", S("all")), ("f", fv("d", 1.0))],
}
HEADER_MESSAGES: dict[str, list[tuple[str, bytes]] | None] = {
    "a1_bx": [("a", fv("b", 1)), ("b", S("x"))],
    "a1": [("a", fv("b", 1))],
    "a_str1": [("a", S("1"))],
    "empty": [],
    "no_headers": None,
    "xk_a1": [("x-k", S("v")), ("a", fv("b", 1))],
    "a_int32_1": [("a", fv("I", 1))],
    "a1_bx_c": [("a", fv("b", 1)), ("b", S("x")), ("c", S("extra"))],
    "xk": [("x-k", S("v"))],
    "a_true": [("a", fv("t", 1))],
    "f_float1": [("f", fv("f", 1.0))],
    "a2": [("a", fv("b", 2))],
}
EVERY_MESSAGE = list(HEADER_MESSAGES)
HEADER_MATCHES: dict[str, list[str]] = {
    "all_a1_bx": ["a1_bx", "a1_bx_c"],
    "any_a1_bx": ["a1_bx", "a1", "xk_a1", "a_int32_1", "a1_bx_c"],
    "empty": EVERY_MESSAGE,
    "default_is_all": ["a1_bx", "a1", "xk_a1", "a_int32_1", "a1_bx_c"],
    "all_with_x": ["xk_a1"],
    "any_with_x": ["xk_a1", "xk"],
    "all_a_str1": ["a_str1"],
    "any_only_x_keys": [],
    "all_only_x_keys": EVERY_MESSAGE,
    # a void binding value only requires the header to be present
    "all_a_void": ["a1_bx", "a1", "a_str1", "xk_a1", "a_int32_1", "a1_bx_c", "a_true", "a2"],
    # integers compare by value whatever their width; floats likewise
    "all_a_long1": ["a1_bx", "a1", "xk_a1", "a_int32_1", "a1_bx_c"],
    "all_a_true": ["a_true"],
    "all_f_double1": ["f_float1"],
}


@pytest.mark.parametrize("exchange_type", ["headers", "predeclared"])
def test_headers_routing(
    client: RawClient, janitor: Janitor, name: str, exchange_type: str
) -> None:
    if exchange_type == "predeclared":
        ex = "amq.headers"
    else:
        ex = janitor.exchange(name)
        client.declare_exchange(1, ex, "headers")
    bindings = list(HEADER_BINDINGS)
    queues = queues_for(client, janitor, name, len(bindings))
    for q, b in zip(queues, bindings, strict=True):
        client.bind_queue_raw(1, q, ex, "ignored", raw_table(HEADER_BINDINGS[b]))
    for msg, items in HEADER_MESSAGES.items():
        body = msg.encode()
        hdr = (
            header_payload(len(body))
            if items is None
            else header_with_table(len(body), raw_table(items))
        )
        client.publish(1, body, exchange=ex, routing_key="ignored-too", raw_header=hdr)
    client.wait_for_confirms(1)
    got = {
        b: [m.decode() for m in client.drain(1, q)] for q, b in zip(queues, bindings, strict=True)
    }
    assert got == HEADER_MATCHES


def test_default_exchange_routes_by_queue_name(
    client: RawClient, janitor: Janitor, name: str
) -> None:
    q1, q2 = queues_for(client, janitor, name, 2)
    client.publish(1, b"one", routing_key=q1)
    client.publish(1, b"two", exchange="", routing_key=q2)
    client.publish(1, b"nobody", routing_key=f"{name}.missing")
    client.wait_for_confirms(1)
    assert client.drain(1, q1) == [b"one"]
    d2 = client.get(1, q2, no_ack=True)
    assert d2 is not None
    assert (d2.body, d2.method.exchange, d2.method.routing_key) == (b"two", "", q2)


@pytest.mark.parametrize(
    ("exchange", "exchange_type"),
    [
        ("amq.direct", "direct"),
        ("amq.fanout", "fanout"),
        ("amq.topic", "topic"),
        ("amq.headers", "headers"),
        ("amq.match", "headers"),
    ],
)
def test_predeclared_exchanges(client: RawClient, exchange: str, exchange_type: str) -> None:
    client.call(
        1,
        commands.Exchange.Declare(exchange=exchange, passive=True),
        commands.Exchange.DeclareOk,
    )
    # re-declaring with the same properties is allowed despite the amq. prefix
    client.declare_exchange(1, exchange, exchange_type, durable=True)
    other = "fanout" if exchange_type != "fanout" else "direct"
    client.send_method(
        1, commands.Exchange.Declare(exchange=exchange, exchange_type=other, durable=True)
    )
    assert client.expect_channel_close(1) == (
        406,
        f"PRECONDITION_FAILED - inequivalent arg 'type' for exchange '{exchange}' "
        f"in vhost '/': received '{other}' but current is '{exchange_type}'",
        40,
        10,
    )


def test_predeclared_exchange_routes(client: RawClient, janitor: Janitor, name: str) -> None:
    (q,) = queues_for(client, janitor, name, 1)
    client.bind_queue(1, q, "amq.direct", name)
    client.bind_queue(1, q, "amq.topic", "t.*")
    client.bind_queue(1, q, "amq.fanout", "")
    client.publish(1, b"direct", exchange="amq.direct", routing_key=name)
    client.publish(1, b"topic", exchange="amq.topic", routing_key="t.x")
    client.publish(1, b"fanout", exchange="amq.fanout", routing_key="zzz")
    client.wait_for_confirms(1)
    client.call(1, commands.Queue.Unbind(queue=q, exchange="amq.fanout"), commands.Queue.UnbindOk)
    # amq.fanout is shared with other tests: only count our own messages
    assert [b for b in client.drain(1, q) if b in (b"direct", b"topic", b"fanout")] == [
        b"direct",
        b"topic",
        b"fanout",
    ]


# -- declaration -------------------------------------------------------------------


def test_declare_passive(client: RawClient, janitor: Janitor, name: str) -> None:
    client.send_method(1, build(commands.Exchange.Declare, exchange=name, passive=True))
    assert client.expect_channel_close(1) == (404, not_found("exchange", name), 40, 10)
    client.channel_open(1)
    ex = janitor.exchange(name)
    client.declare_exchange(1, ex, "topic", durable=True)
    # passive declare ignores type and flags
    client.call(
        1,
        build(commands.Exchange.Declare, exchange=ex, exchange_type="fanout", passive=True),
        commands.Exchange.DeclareOk,
    )


def test_redeclare_with_same_properties(client: RawClient, janitor: Janitor, name: str) -> None:
    ex = janitor.exchange(name)
    for _ in range(2):
        client.declare_exchange(
            1, ex, "topic", durable=True, arguments={"alternate-exchange": "amq.fanout"}
        )


@pytest.mark.parametrize(
    ("changes", "arg", "received", "current"),
    [
        ({"exchange_type": "fanout"}, "type", "'fanout'", "'direct'"),
        ({"durable": True}, "durable", "'true'", "'false'"),
        ({"auto_delete": True}, "auto_delete", "'true'", "'false'"),
        ({"internal": True}, "internal", "'true'", "'false'"),
        (
            {"arguments": {"alternate-exchange": "ae"}},
            "alternate-exchange",
            "the value 'ae' of type 'longstr'",
            "none",
        ),
    ],
    ids=["type", "durable", "auto_delete", "internal", "alternate-exchange"],
)
def test_inequivalent_redeclare(
    client: RawClient,
    janitor: Janitor,
    name: str,
    changes: dict[str, object],
    arg: str,
    received: str,
    current: str,
) -> None:
    ex = janitor.exchange(name)
    client.declare_exchange(1, ex, "direct")
    kw: dict[str, object] = {"exchange_type": "direct", **changes}
    client.send_method(1, build(commands.Exchange.Declare, exchange=ex, **kw))
    assert client.expect_channel_close(1) == (
        406,
        f"PRECONDITION_FAILED - inequivalent arg '{arg}' for exchange '{ex}' in vhost '/': "
        f"received {received} but current is {current}",
        40,
        10,
    )


def test_amq_prefix_reserved(client: RawClient, name: str) -> None:
    ex = f"amq.{name}"
    client.send_method(1, build(commands.Exchange.Declare, exchange=ex, exchange_type="direct"))
    assert client.expect_channel_close(1) == (
        403,
        f"ACCESS_REFUSED - exchange name '{ex}' contains reserved prefix 'amq.*'",
        40,
        10,
    )


def test_unknown_exchange_type_is_a_connection_error(client: RawClient, name: str) -> None:
    client.send_method(
        1, build(commands.Exchange.Declare, exchange=name, exchange_type="no-such-type")
    )
    assert client.expect_close() == (
        503,
        "COMMAND_INVALID - unknown exchange type 'no-such-type'",
        40,
        10,
    )


@pytest.mark.parametrize(
    ("method", "ids"),
    [
        (commands.Exchange.Declare(exchange="", exchange_type="direct"), (40, 10)),
        (commands.Exchange.Declare(exchange="", passive=True), (40, 10)),
        (commands.Exchange.Delete(exchange=""), (40, 20)),
        (commands.Exchange.Bind(destination="amq.fanout", source="", routing_key="k"), (40, 30)),
        (commands.Exchange.Bind(destination="", source="amq.fanout", routing_key="k"), (40, 30)),
    ],
    ids=["declare", "declare-passive", "delete", "bind-source", "bind-destination"],
)
def test_default_exchange_operations_forbidden(
    client: RawClient, method: commands.Exchange.Declare, ids: tuple[int, int]
) -> None:
    client.send_method(1, method)
    assert client.expect_channel_close(1) == (403, DEFAULT_EXCHANGE_REFUSED, *ids)


@pytest.mark.parametrize("op", ["bind", "unbind"])
def test_queue_bindings_on_default_exchange_forbidden(
    client: RawClient, janitor: Janitor, name: str, op: str
) -> None:
    (q,) = queues_for(client, janitor, name, 1)
    cls = commands.Queue.Bind if op == "bind" else commands.Queue.Unbind
    client.send_method(1, build(cls, queue=q, exchange="", routing_key=q))
    method_id = 20 if op == "bind" else 50
    assert client.expect_channel_close(1) == (403, DEFAULT_EXCHANGE_REFUSED, 50, method_id)


# -- deletion ----------------------------------------------------------------------


def test_delete_system_exchange_forbidden(client: RawClient) -> None:
    client.send_method(1, commands.Exchange.Delete(exchange="amq.direct"))
    assert client.expect_channel_close(1) == (
        403,
        "ACCESS_REFUSED - deletion of system exchange 'amq.direct' in vhost '/' not allowed",
        40,
        20,
    )


def test_delete_missing_exchange_succeeds(client: RawClient, name: str) -> None:
    client.call(1, build(commands.Exchange.Delete, exchange=name), commands.Exchange.DeleteOk)
    client.call(
        1,
        build(commands.Exchange.Delete, exchange=name, if_unused=True),
        commands.Exchange.DeleteOk,
    )


def test_delete_removes_exchange_and_bindings(
    client: RawClient, janitor: Janitor, name: str
) -> None:
    ex = janitor.exchange(name)
    client.declare_exchange(1, ex, "fanout")
    (q,) = queues_for(client, janitor, name, 1)
    client.bind_queue(1, q, ex)
    client.delete_exchange(1, ex)
    client.send_method(1, build(commands.Exchange.Declare, exchange=ex, passive=True))
    assert client.expect_channel_close(1) == (404, not_found("exchange", ex), 40, 10)
    client.channel_open(1)
    client.declare_exchange(1, ex, "fanout")
    client.confirm_select(1)
    client.publish(1, b"x", exchange=ex)
    client.wait_for_confirms(1)
    assert client.drain(1, q) == []  # the old binding is gone


def test_delete_if_unused(client: RawClient, janitor: Janitor, name: str) -> None:
    ex = janitor.exchange(name)
    client.declare_exchange(1, ex, "direct")
    (q,) = queues_for(client, janitor, name, 1)
    client.bind_queue(1, q, ex, "k")
    client.send_method(1, build(commands.Exchange.Delete, exchange=ex, if_unused=True))
    assert client.expect_channel_close(1) == (
        406,
        f"PRECONDITION_FAILED - exchange '{ex}' in vhost '/' in use",
        40,
        20,
    )
    client.channel_open(1)
    client.call(1, build(commands.Queue.Unbind, queue=q, exchange=ex, routing_key="k"),
                commands.Queue.UnbindOk)  # fmt: skip
    # being the destination of an exchange binding does not count as "used"
    client.call(
        1,
        build(commands.Exchange.Bind, destination=ex, source="amq.fanout", routing_key="k"),
        commands.Exchange.BindOk,
    )
    client.call(
        1, build(commands.Exchange.Delete, exchange=ex, if_unused=True), commands.Exchange.DeleteOk
    )


def test_auto_delete_exchange_goes_with_last_binding(
    client: RawClient, janitor: Janitor, name: str
) -> None:
    ex = janitor.exchange(name)
    client.declare_exchange(1, ex, "direct", auto_delete=True)
    (q,) = queues_for(client, janitor, name, 1)
    passive = build(commands.Exchange.Declare, exchange=ex, passive=True)
    client.call(1, passive, commands.Exchange.DeclareOk)  # never bound: still there
    client.bind_queue(1, q, ex, "k1")
    client.bind_queue(1, q, ex, "k2")
    client.call(1, build(commands.Queue.Unbind, queue=q, exchange=ex, routing_key="k1"),
                commands.Queue.UnbindOk)  # fmt: skip
    client.call(1, passive, commands.Exchange.DeclareOk)
    client.call(1, build(commands.Queue.Unbind, queue=q, exchange=ex, routing_key="k2"),
                commands.Queue.UnbindOk)  # fmt: skip
    client.send_method(1, passive)
    assert client.expect_channel_close(1) == (404, not_found("exchange", ex), 40, 10)


def test_auto_delete_exchange_goes_when_bound_queue_is_deleted(
    client: RawClient, janitor: Janitor, name: str
) -> None:
    ex = janitor.exchange(name)
    client.declare_exchange(1, ex, "fanout", auto_delete=True)
    (q,) = queues_for(client, janitor, name, 1)
    client.bind_queue(1, q, ex)
    client.delete_queue(1, q)
    client.send_method(1, build(commands.Exchange.Declare, exchange=ex, passive=True))
    assert client.expect_channel_close(1) == (404, not_found("exchange", ex), 40, 10)


def test_auto_delete_exchange_and_exchange_bindings(
    client: RawClient, janitor: Janitor, name: str
) -> None:
    ex = janitor.exchange(name)
    passive = build(commands.Exchange.Declare, exchange=ex, passive=True)
    # as destination only: unbinding does not delete it
    client.declare_exchange(1, ex, "direct", auto_delete=True)
    bind_in = build(commands.Exchange.Bind, destination=ex, source="amq.fanout", routing_key="k")
    unbind_in = build(
        commands.Exchange.Unbind, destination=ex, source="amq.fanout", routing_key="k"
    )
    client.call(1, bind_in, commands.Exchange.BindOk)
    client.call(1, unbind_in, commands.Exchange.UnbindOk)
    client.call(1, passive, commands.Exchange.DeclareOk)
    # as source: removing its last binding deletes it
    bind_out = build(commands.Exchange.Bind, destination="amq.fanout", source=ex, routing_key="k")
    unbind_out = build(
        commands.Exchange.Unbind, destination="amq.fanout", source=ex, routing_key="k"
    )
    client.call(1, bind_out, commands.Exchange.BindOk)
    client.call(1, unbind_out, commands.Exchange.UnbindOk)
    client.send_method(1, passive)
    assert client.expect_channel_close(1) == (404, not_found("exchange", ex), 40, 10)


def test_a_deleted_destination_leaves_every_exchange_bound_to_it(
    client: RawClient, janitor: Janitor, name: str
) -> None:
    """A queue or exchange bound from several exchanges (each of which keeps other
    bindings) goes from all of them when it is deleted, and only from them."""
    a, b, c, d = (janitor.exchange(f"{name}.{x}") for x in "abcd")
    client.declare_exchange(1, a, "fanout")
    client.declare_exchange(1, b, "fanout", auto_delete=True)
    client.declare_exchange(1, c, "direct")
    client.declare_exchange(1, d, "fanout")
    q, other = queues_for(client, janitor, name, 2)
    for source in (a, b):
        client.bind_queue(1, q, source)
    client.bind_queue(1, q, c, "k")
    client.bind_queue(1, other, c, "other")
    for source, key in ((a, ""), (c, "k")):
        bind = build(commands.Exchange.Bind, destination=d, source=source, routing_key=key)
        client.call(1, bind, commands.Exchange.BindOk)
    client.delete_queue(1, q)
    client.send_method(1, build(commands.Exchange.Declare, exchange=b, passive=True))
    assert client.expect_channel_close(1) == (404, not_found("exchange", b), 40, 10)
    client.channel_open(1)
    client.declare_queue(1, q, durable=True)  # the same name, no bindings
    client.delete_exchange(1, d)
    for source, key in ((a, ""), (c, "k")):
        client.publish(1, b"x", exchange=source, routing_key=key, mandatory=True)
        assert client.read_return(1).method.reply_text == "NO_ROUTE"
    client.publish(1, b"y", exchange=c, routing_key="other", mandatory=True)
    got = client.get(1, other, no_ack=True)
    assert got is not None and got.body == b"y"
    assert client.get(1, q) is None


def test_durable_exchange(client: RawClient, janitor: Janitor, name: str) -> None:
    ex = janitor.exchange(name)
    client.declare_exchange(1, ex, "topic", durable=True)
    client.call(
        1, build(commands.Exchange.Declare, exchange=ex, passive=True), commands.Exchange.DeclareOk
    )
    client.delete_exchange(1, ex)


# -- internal, alternate, exchange-to-exchange ------------------------------------


def test_publish_to_internal_exchange_refused(
    client: RawClient, janitor: Janitor, name: str
) -> None:
    ex = janitor.exchange(name)
    client.declare_exchange(1, ex, "fanout", internal=True)
    client.publish(1, b"x", exchange=ex)
    assert client.expect_channel_close(1) == (
        403,
        f"ACCESS_REFUSED - cannot publish to internal exchange '{ex}' in vhost '/'",
        60,
        40,
    )


def test_internal_exchange_reachable_through_exchange_binding(
    client: RawClient, janitor: Janitor, name: str
) -> None:
    internal = janitor.exchange(f"{name}.internal")
    front = janitor.exchange(f"{name}.front")
    client.declare_exchange(1, internal, "fanout", internal=True)
    client.declare_exchange(1, front, "direct")
    client.call(
        1,
        build(commands.Exchange.Bind, destination=internal, source=front, routing_key="k"),
        commands.Exchange.BindOk,
    )
    (q,) = queues_for(client, janitor, name, 1)
    client.bind_queue(1, q, internal)
    client.publish(1, b"via front", exchange=front, routing_key="k")
    client.wait_for_confirms(1)
    d = client.get(1, q, no_ack=True)
    assert d is not None
    assert (d.body, d.method.exchange) == (b"via front", front)


def test_publish_to_missing_exchange(client: RawClient, name: str) -> None:
    client.publish(1, b"x", exchange=name, routing_key="k")
    assert client.expect_channel_close(1) == (404, not_found("exchange", name), 60, 40)


def test_exchange_to_exchange_bind_and_unbind(
    client: RawClient, janitor: Janitor, name: str
) -> None:
    src = janitor.exchange(f"{name}.src")
    dst = janitor.exchange(f"{name}.dst")
    client.declare_exchange(1, src, "topic")
    client.declare_exchange(1, dst, "direct")
    bind = build(commands.Exchange.Bind, destination=dst, source=src, routing_key="a.*")
    client.call(1, bind, commands.Exchange.BindOk)
    client.call(1, bind, commands.Exchange.BindOk)  # idempotent
    (q,) = queues_for(client, janitor, name, 1)
    client.bind_queue(1, q, dst, "a.b")
    # the routing key is matched again at each hop
    for key in ("a.b", "a.c", "x.b"):
        client.publish(1, key.encode(), exchange=src, routing_key=key)
    client.wait_for_confirms(1)
    d = client.get(1, q, no_ack=True)
    assert d is not None
    assert (d.body, d.method.exchange, d.method.routing_key) == (b"a.b", src, "a.b")
    assert client.get(1, q, no_ack=True) is None
    # a cycle still delivers a single copy per queue
    back = build(commands.Exchange.Bind, destination=src, source=dst, routing_key="a.b")
    client.call(1, back, commands.Exchange.BindOk)
    client.publish(1, b"cycle", exchange=src, routing_key="a.b")
    client.wait_for_confirms(1)
    assert client.drain(1, q) == [b"cycle"]
    unbind = build(commands.Exchange.Unbind, destination=dst, source=src, routing_key="a.*")
    client.call(1, unbind, commands.Exchange.UnbindOk)
    client.call(1, unbind, commands.Exchange.UnbindOk)  # missing binding: still ok
    client.publish(1, b"after unbind", exchange=src, routing_key="a.b")
    client.wait_for_confirms(1)
    assert client.drain(1, q) == []


def test_a_long_chain_of_exchange_bindings_routes(
    client: RawClient, janitor: Janitor, name: str
) -> None:
    # deeper than Python's recursion limit: routing walks the chain without recursing
    chain = [janitor.exchange(f"{name}.e{i}") for i in range(1500)]
    ae = janitor.exchange(f"{name}.ae")
    client.declare_exchange(1, ae, "fanout")
    client.declare_exchange(1, chain[0], "direct", arguments={"alternate-exchange": ae})
    for ex in chain[1:]:
        client.declare_exchange(1, ex, "direct")
    for src, dst in itertools.pairwise(chain):
        bind = build(commands.Exchange.Bind, destination=dst, source=src, routing_key="k")
        client.call(1, bind, commands.Exchange.BindOk)
    q_end, q_ae = queues_for(client, janitor, name, 2)
    client.bind_queue(1, q_end, chain[-1], "k")
    client.bind_queue(1, q_ae, ae)
    client.publish(1, b"through", exchange=chain[0], routing_key="k")
    # the whole chain found no queue for this key: the first exchange's alternate takes it
    client.publish(1, b"aside", exchange=chain[0], routing_key="other")
    assert client.wait_for_confirms(1) == {1: True, 2: True}
    assert client.drain(1, q_end) == [b"through"]
    assert client.drain(1, q_ae) == [b"aside"]


@pytest.mark.parametrize("missing", ["source", "destination"])
def test_exchange_bind_missing_exchange(client: RawClient, name: str, missing: str) -> None:
    other = f"{name}.missing"
    kw = {"source": other, "destination": "amq.fanout"}
    if missing == "destination":
        kw = {"source": "amq.direct", "destination": other}
    client.send_method(1, build(commands.Exchange.Bind, routing_key="k", **kw))
    assert client.expect_channel_close(1) == (404, not_found("exchange", other), 40, 30)


def test_exchange_unbind_missing_exchange_succeeds(client: RawClient, name: str) -> None:
    client.call(
        1,
        build(commands.Exchange.Unbind, destination=name, source="amq.direct", routing_key="k"),
        commands.Exchange.UnbindOk,
    )


def test_alternate_exchange(client: RawClient, janitor: Janitor, name: str) -> None:
    ae = janitor.exchange(f"{name}.ae")
    main = janitor.exchange(f"{name}.main")
    client.declare_exchange(1, ae, "fanout")
    client.declare_exchange(1, main, "direct", arguments={"alternate-exchange": ae})
    q_main, q_ae = queues_for(client, janitor, name, 2)
    client.bind_queue(1, q_main, main, "k")
    client.bind_queue(1, q_ae, ae)
    client.publish(1, b"routed", exchange=main, routing_key="k")
    client.publish(1, b"unrouted", exchange=main, routing_key="other", mandatory=True)
    assert client.wait_for_confirms(1) == {1: True, 2: True}
    client.assert_silent(0.2)  # no basic.return: the alternate exchange took it
    assert client.drain(1, q_main) == [b"routed"]
    d = client.get(1, q_ae, no_ack=True)
    assert d is not None
    # delivered with the original exchange and routing key
    assert (d.body, d.method.exchange, d.method.routing_key) == (b"unrouted", main, "other")


def test_missing_alternate_exchange_means_unroutable(
    client: RawClient, janitor: Janitor, name: str
) -> None:
    main = janitor.exchange(name)
    client.declare_exchange(1, main, "direct", arguments={"alternate-exchange": f"{name}.missing"})
    client.publish(1, b"lost", exchange=main, routing_key="k", mandatory=True)
    r = client.read_return(1)
    assert (r.method.reply_code, r.method.reply_text, r.body) == (312, "NO_ROUTE", b"lost")


# -- names -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "suffix",
    ["queue with spaces|*", "очередь", "#.*|{}[]'\"\\ ünï©ødé 😀"],
    ids=["spaces-pipe-star", "cyrillic", "punctuation-emoji"],
)
def test_odd_names_end_to_end(client: RawClient, janitor: Janitor, name: str, suffix: str) -> None:
    q = janitor.queue(f"{name} {suffix}")
    ex = janitor.exchange(f"{name} обмен {suffix}")
    key = f"ключ {suffix}"
    ok = client.declare_queue(1, q, durable=True)
    assert ok.queue == q
    client.declare_exchange(1, ex, "direct")
    client.call(
        1, build(commands.Exchange.Declare, exchange=ex, passive=True), commands.Exchange.DeclareOk
    )
    client.bind_queue(1, q, ex, key)
    client.publish(1, "тело".encode(), exchange=ex, routing_key=key)
    client.publish(1, b"second", exchange=ex, routing_key=key)
    client.wait_for_confirms(1)
    g = client.get(1, q, no_ack=True)
    assert g is not None
    assert (g.method.exchange, g.method.routing_key, g.body) == (ex, key, "тело".encode())
    tag = client.consume(1, q, consumer_tag=f"потребитель {suffix}", no_ack=True)
    assert tag == f"потребитель {suffix}"
    d = client.read_delivery(1)
    assert (d.method.consumer_tag, d.method.exchange, d.method.routing_key, d.body) == (
        tag,
        ex,
        key,
        b"second",
    )
    client.call(1, build(commands.Basic.Cancel, consumer_tag=tag), commands.Basic.CancelOk)
    client.call(1, build(commands.Queue.Unbind, queue=q, exchange=ex, routing_key=key),
                commands.Queue.UnbindOk)  # fmt: skip
    client.call(1, build(commands.Queue.Purge, queue=q), commands.Queue.PurgeOk)
    client.delete_queue(1, q)
    client.delete_exchange(1, ex)


def test_headers_binding_with_invalid_x_match_refused(client: RawClient, name: str) -> None:
    client.declare_queue(1, name, exclusive=True)
    client.send_method(
        1,
        build(
            commands.Queue.Bind,
            queue=name,
            exchange="amq.headers",
            arguments={"x-match": "some", "a": "b"},
        ),
    )
    assert client.expect_channel_close(1) == (
        406,
        'PRECONDITION_FAILED - Invalid x-match field value <<"some">>; expected all, any, '
        "all-with-x, or any-with-x",
        50,
        20,
    )


def test_a_publish_repeated_after_its_exchange_went_or_came_back(
    amqp_addr: tuple[str, int], janitor: Janitor, name: str
) -> None:
    """The same publish again and again on one channel (exchange, routing key and flags
    unchanged) finds the exchange anew each time: once it is declared again, its new
    bindings route; once it is gone, a 404 (RabbitMQ 4.3: rabbit_channel.erl,
    handle_method/3 for basic.publish, looks the exchange up on every publish with
    rabbit_exchange:lookup_or_die/1)."""
    ex = janitor.exchange(name)
    first, second = janitor.queue(f"{name}.1"), janitor.queue(f"{name}.2")
    with RawClient.connect(amqp_addr) as c:
        c.channel_open(2)
        for q in (first, second):
            c.declare_queue(2, q, durable=True)
        c.declare_exchange(2, ex, "direct")
        c.bind_queue(2, first, ex, "k")
        c.publish(1, b"a", ex, "k")
        c.publish(1, b"b", ex, "k")
        c.delete_exchange(2, ex)
        c.declare_exchange(2, ex, "direct")
        c.bind_queue(2, second, ex, "k")
        c.publish(1, b"c", ex, "k")
        c.delete_exchange(2, ex)
        c.publish(1, b"d", ex, "k")
        assert c.expect_channel_close(1) == (404, not_found("exchange", ex), 60, 40)
        assert c.drain(2, first) == [b"a", b"b"] and c.drain(2, second) == [b"c"]
