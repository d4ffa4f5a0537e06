"""Publisher confirms and transactions."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from amqp_raw import Janitor, RawClient, build
from pamqp import commands


@pytest.fixture
def janitor(amqp_addr: tuple[str, int]) -> Iterator[Janitor]:
    j = Janitor(amqp_addr)
    yield j
    j.clean()


@pytest.fixture
def client(amqp_addr: tuple[str, int]) -> Iterator[RawClient]:
    c = RawClient.connect(amqp_addr)
    yield c
    c.close()


@pytest.fixture
def queue(client: RawClient, janitor: Janitor, name: str) -> str:
    q = janitor.queue(name)
    client.declare_queue(1, q, durable=True)
    return q


def tx_select(c: RawClient, channel: int = 1) -> None:
    c.call(channel, commands.Tx.Select(), commands.Tx.SelectOk)


def commit(c: RawClient, channel: int = 1) -> None:
    c.call(channel, commands.Tx.Commit(), commands.Tx.CommitOk)


def rollback(c: RawClient, channel: int = 1) -> None:
    c.call(channel, commands.Tx.Rollback(), commands.Tx.RollbackOk)


def observer(c: RawClient) -> int:
    """A second, non-transactional channel to look at the queue from."""
    if 2 not in c.open_channels:
        c.channel_open(2)
    return 2


def ready_count(c: RawClient, queue: str) -> int:
    return int(c.declare_queue(observer(c), queue, passive=True).message_count or 0)


def drain(c: RawClient, queue: str) -> list[bytes]:
    return c.drain(observer(c), queue)


# -- confirms ----------------------------------------------------------------------


def test_confirm_select_ok(client: RawClient) -> None:
    client.send_method(1, commands.Confirm.Select())
    ok = client.expect_method(commands.Confirm.SelectOk, 1)
    assert isinstance(ok, commands.Confirm.SelectOk)
    # selecting again is harmless
    client.call(1, commands.Confirm.Select(), commands.Confirm.SelectOk)


def test_publishes_are_acked_by_sequence_number(
    client: RawClient, janitor: Janitor, name: str, queue: str
) -> None:
    client.publish(1, b"before select", routing_key=queue)  # not counted
    client.confirm_select(1)
    for i in range(50):
        client.publish(1, str(i).encode(), routing_key=queue)
    # unroutable publishes are acked too
    client.publish(1, b"nowhere", exchange="amq.direct", routing_key=name)
    settled = client.wait_for_confirms(1)
    assert settled == dict.fromkeys(range(1, 52), True)
    client.assert_silent(0.2)  # nothing confirmed twice, nothing beyond 51
    assert ready_count(client, queue) == 51


def test_confirm_select_nowait(client: RawClient, queue: str) -> None:
    client.send_method(1, commands.Confirm.Select(nowait=True))
    client.publish_seq[1] = 0
    client.publish(1, b"x", routing_key=queue)
    frames = client.frames_within(0.3)
    assert len(frames) == 1, frames  # no select-ok, just the ack
    ack = frames[0].method()
    assert isinstance(ack, commands.Basic.Ack)
    assert (ack.delivery_tag, ack.multiple) == (1, False)


def test_mandatory_unroutable_returned_before_its_ack(client: RawClient, name: str) -> None:
    client.confirm_select(1)
    client.publish(1, b"lost", exchange="amq.direct", routing_key=name, mandatory=True)
    ret = client.read_return(1)
    assert (ret.method.reply_code, ret.method.reply_text, ret.body) == (312, "NO_ROUTE", b"lost")
    ack = client.expect_method(commands.Basic.Ack, 1)
    assert ack.delivery_tag == 1


def test_returns_and_acks_interleaved(client: RawClient, queue: str, name: str) -> None:
    client.confirm_select(1)
    for i in range(6):
        if i % 2:
            client.publish(1, b"%d" % i, exchange="amq.direct", routing_key=name, mandatory=True)
        else:
            client.publish(1, b"%d" % i, routing_key=queue, mandatory=True)
    returned: list[bytes] = []
    acked: set[int] = set()
    while len(acked) < 6:
        _, m = client.read_method()
        if isinstance(m, commands.Basic.Return):
            d = client.read_content(1, m)
            seq = int(d.body) + 1
            assert seq not in acked, "a return must precede the ack of its message"
            returned.append(d.body)
        else:
            assert isinstance(m, commands.Basic.Ack), m
            acked.update(range(1, m.delivery_tag + 1) if m.multiple else [m.delivery_tag])
    assert returned == [b"1", b"3", b"5"]
    assert acked == set(range(1, 7))


def test_publish_to_missing_exchange_in_confirm_mode(client: RawClient, name: str) -> None:
    client.confirm_select(1)
    client.publish(1, b"x", exchange=name)
    assert client.expect_channel_close(1) == (
        404,
        f"NOT_FOUND - no exchange '{name}' in vhost '/'",
        60,
        40,
    )


def test_sequence_numbers_are_per_channel(client: RawClient, queue: str) -> None:
    client.channel_open(2)
    client.confirm_select(1)
    client.confirm_select(2)
    for _ in range(3):
        client.publish(1, b"a", routing_key=queue)
    client.publish(2, b"b", routing_key=queue)
    assert client.wait_for_confirms(2) == {1: True}
    assert client.wait_for_confirms(1) == {1: True, 2: True, 3: True}


def test_tx_select_on_confirm_channel(client: RawClient) -> None:
    client.confirm_select(1)
    client.send_method(1, commands.Tx.Select())
    assert client.expect_channel_close(1) == (
        406,
        "PRECONDITION_FAILED - cannot switch from confirm to tx mode",
        90,
        10,
    )


def test_confirm_select_on_tx_channel(client: RawClient) -> None:
    tx_select(client)
    client.send_method(1, commands.Confirm.Select())
    assert client.expect_channel_close(1) == (
        406,
        "PRECONDITION_FAILED - cannot switch from tx to confirm mode",
        85,
        10,
    )


# -- transactions --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "method_id"), [(commands.Tx.Commit(), 20), (commands.Tx.Rollback(), 30)]
)
def test_commit_or_rollback_without_select(
    client: RawClient, method: commands.Tx.Commit, method_id: int
) -> None:
    client.send_method(1, method)
    assert client.expect_channel_close(1) == (
        406,
        "PRECONDITION_FAILED - channel is not transactional",
        90,
        method_id,
    )


def test_tx_select_twice(client: RawClient) -> None:
    tx_select(client)
    tx_select(client)
    commit(client)


def test_commit_makes_publishes_visible(client: RawClient, queue: str) -> None:
    tx_select(client)
    client.publish(1, b"a", routing_key=queue)
    client.publish(1, b"b", routing_key=queue)
    assert ready_count(client, queue) == 0
    assert client.get(observer(client), queue) is None
    commit(client)
    assert drain(client, queue) == [b"a", b"b"]


def test_rollback_discards_publishes(client: RawClient, queue: str) -> None:
    tx_select(client)
    client.publish(1, b"discarded", routing_key=queue)
    rollback(client)
    client.publish(1, b"kept", routing_key=queue)
    commit(client)
    assert drain(client, queue) == [b"kept"]


def test_channel_close_discards_uncommitted_publishes(client: RawClient, queue: str) -> None:
    tx_select(client)
    client.publish(1, b"uncommitted", routing_key=queue)
    client.channel_close(1)
    client.channel_open(1)
    assert client.get(1, queue) is None


def test_mandatory_return_at_commit(client: RawClient, name: str) -> None:
    tx_select(client)
    client.publish(1, b"lost", exchange="amq.direct", routing_key=name, mandatory=True)
    client.assert_silent(0.2)  # nothing until commit
    client.send_method(1, commands.Tx.Commit())
    ret = client.read_return(1)
    assert (ret.method.reply_code, ret.method.reply_text, ret.body) == (312, "NO_ROUTE", b"lost")
    client.expect_method(commands.Tx.CommitOk, 1)


def test_acks_apply_at_commit(client: RawClient, queue: str) -> None:
    client.channel_open(3)
    client.confirm_select(3)
    for body in (b"0", b"1", b"2"):
        client.publish(3, body, routing_key=queue)
    client.wait_for_confirms(3)
    tx_select(client)
    client.consume(1, queue, "c")
    got = client.deliveries(1, 3)  # deliveries are not held back by the transaction
    client.ack(1, got[0].method.delivery_tag)
    client.ack(1, got[1].method.delivery_tag)
    rollback(client)  # forget both acks
    client.ack(1, got[2].method.delivery_tag)
    commit(client)
    client.call(1, build(commands.Basic.Cancel, consumer_tag="c"), commands.Basic.CancelOk)
    client.channel_close(1)  # unacked messages go back
    client.channel_open(1)
    assert sorted(client.drain(1, queue)) == [b"0", b"1"]


def test_a_multiple_ack_after_a_rollback_covers_the_tags_rolled_back(
    client: RawClient, queue: str
) -> None:
    for body in (b"0", b"1", b"2", b"3", b"4"):
        client.publish(1, body, routing_key=queue)
    tx_select(client)
    client.consume(1, queue, "c")
    got = client.deliveries(1, 5)
    client.ack(1, got[2].method.delivery_tag, multiple=True)  # 1-3
    rollback(client)  # 1-3 unacked again
    client.ack(1, got[3].method.delivery_tag)  # 4 alone
    client.ack(1, got[3].method.delivery_tag, multiple=True)  # not unacked any more
    code, text, _, _ = client.expect_channel_close(1)
    assert (code, text) == (406, "PRECONDITION_FAILED - unknown delivery tag 4")
    client.channel_open(1)  # the close requeued 1-3 and 5; the ack of 4 was not committed
    assert sorted(client.drain(1, queue)) == [b"0", b"1", b"2", b"3", b"4"]
    for body in (b"5", b"6", b"7", b"8", b"9"):
        client.publish(1, body, routing_key=queue)
    tx_select(client)
    client.consume(1, queue, "d")
    got = client.deliveries(1, 5)
    client.ack(1, got[1].method.delivery_tag, multiple=True)
    rollback(client)
    client.ack(1, got[3].method.delivery_tag, multiple=True)  # 1-4, the rolled back too
    commit(client)
    client.call(1, build(commands.Basic.Cancel, consumer_tag="d"), commands.Basic.CancelOk)
    client.channel_close(1)
    client.channel_open(1)
    assert client.drain(1, queue) == [b"9"]


def test_uncommitted_acks_are_not_applied(client: RawClient, queue: str) -> None:
    client.channel_open(3)
    client.confirm_select(3)
    client.publish(3, b"m", routing_key=queue)
    client.wait_for_confirms(3)
    tx_select(client)
    d = client.get(1, queue)
    assert d is not None
    client.ack(1, d.method.delivery_tag)
    client.channel_close(1)  # closed without commit: the ack never happened
    client.channel_open(1)
    again = client.get(1, queue, no_ack=True)
    assert again is not None
    assert (again.body, again.method.redelivered) == (b"m", True)


def test_transaction_continues_after_commit(client: RawClient, queue: str) -> None:
    tx_select(client)
    client.publish(1, b"first", routing_key=queue)
    commit(client)
    client.publish(1, b"second", routing_key=queue)
    assert ready_count(client, queue) == 1
    assert drain(client, queue) == [b"first"]
    rollback(client)
    commit(client)
    assert drain(client, queue) == []
