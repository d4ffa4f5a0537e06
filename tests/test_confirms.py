"""Publisher confirms without a socket: the orderings broker/engine/confirms.py owns.

The socket tests (test_confirms_tx.py, test_durability.py) see these only when
the disk happens to be slow; here each ordering is built on purpose.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from warren.broker.engine.confirms import ACK, NACK, Confirms


def test_a_window_of_accepted_publishes_is_one_multiple_ack() -> None:
    c = Confirms()
    for _ in range(5):
        c.accepted(c.published())
    assert c.due() == [(ACK, 1, 5)]
    assert c.due() == []
    c.accepted(c.published())
    assert c.due() == [(ACK, 6, 6)]  # a single publish: multiple=false
    assert c.unconfirmed == 0


def test_acks_due_go_before_a_nack() -> None:
    c = Confirms()
    c.accepted(c.published())
    c.nacked(c.published())
    assert c.due() == [(ACK, 1, 1), (NACK, 2, 2)]


def test_a_nack_overtakes_publishes_waiting_for_the_disk_and_acks_step_around_it() -> None:
    c = Confirms()
    c.wait_disk(c.published(), batch=7)
    c.wait_disk(c.published(), batch=7)
    c.nacked(c.published())  # seq 3 refused while 1 and 2 wait for the fsync
    assert c.due() == [(NACK, 3, 3)]
    c.accepted(c.published())  # seq 4: its ack would cover 1 and 2, so it waits too
    assert c.due() == []
    assert c.synced(7)
    # no ack may cover the nacked 3
    assert c.due() == [(ACK, 1, 2), (ACK, 4, 4)]
    assert c.unconfirmed == 0


def test_an_accepted_publish_waits_behind_earlier_disk_writes() -> None:
    c = Confirms()
    c.wait_disk(c.published(), batch=1)
    c.accepted(c.published())  # e.g. a direct reply-to publish, nothing to store
    assert c.due() == []
    c.synced(1)
    assert c.due() == [(ACK, 1, 2)]


def test_an_older_batch_confirms_only_its_own_publishes() -> None:
    c = Confirms()
    c.wait_disk(c.published(), batch=1)
    c.wait_disk(c.published(), batch=2)
    c.wait_disk(c.published(), batch=2)
    assert not c.synced(0)
    assert c.synced(1)
    assert c.due() == [(ACK, 1, 1)]
    assert c.waiting() == 2
    assert c.synced(5)
    assert c.due() == [(ACK, 2, 3)]
    assert not c.waiting_for_disk


def test_a_nack_with_nothing_on_disk_settles_everything_before_it() -> None:
    c = Confirms()
    c.nacked(c.published())
    c.nacked(c.published())
    c.accepted(c.published())
    assert c.due() == [(NACK, 1, 1), (NACK, 2, 2), (ACK, 3, 3)]


def test_a_failed_disk_nacks_what_waited_around_earlier_nacks() -> None:
    c = Confirms()
    c.accepted(c.published())  # 1: due, not yet sent
    c.wait_disk(c.published(), batch=3)  # 2
    c.wait_disk(c.published(), batch=3)  # 3
    c.nacked(c.published())  # 4, nacked ahead
    c.wait_disk(c.published(), batch=4)  # 5
    assert c.due() == [(ACK, 1, 1), (NACK, 4, 4)]
    c.disk_failed()
    assert c.due() == [(NACK, 2, 3), (NACK, 5, 5)]
    assert c.unconfirmed == 0 and not c.waiting_for_disk


def test_stored_copies_settle_a_publish_one_by_one_without_a_batch() -> None:
    # a persistent message acked before its record was written is confirmed then, without
    # a write, as RabbitMQ confirms one whose msg_store write a remove made needless
    # (rabbit_msg_store's flying writes, rabbit_variable_queue:msgs_written_to_disk/3)
    c = Confirms()
    c.wait_disk(c.published(), -1, 2)  # 1: fanned out to two durable queues
    c.wait_disk(c.published(), -1, 1)  # 2
    assert not c.settled(2)  # its ack would cover 1, which still waits
    assert not c.settled(1)
    assert c.due() == []
    assert c.settled(1)
    assert c.due() == [(ACK, 1, 2)]
    assert not c.waiting_for_disk


def test_settles_in_reverse_order_confirm_everything_once_the_first_settles() -> None:
    # consumers ack in any order: each settle finds its publish among thousands waiting
    c = Confirms()
    for _ in range(5_000):
        c.wait_disk(c.published(), -1, 1)
    for seq in range(5_000, 1, -1):
        assert not c.settled(seq)
    assert c.due() == []
    assert c.settled(1)
    assert c.due() == [(ACK, 1, 5_000)]
    assert not c.settled(3)  # a late duplicate finds nothing


def test_a_publish_with_a_batch_and_copies_waits_for_both() -> None:
    c = Confirms()
    c.wait_disk(c.published(), 4, 1)  # a stream's chunk in batch 4 and a classic queue's copy
    assert not c.settled(1)
    assert c.synced(4)
    assert c.due() == [(ACK, 1, 1)]


def test_a_settle_after_the_disk_failed_touches_no_later_publish() -> None:
    c = Confirms()
    c.wait_disk(c.published(), -1, 1)
    c.disk_failed()
    assert c.due() == [(NACK, 1, 1)]
    c.wait_disk(c.published(), -1, 1)
    assert not c.settled(1)  # the late settle of 1 leaves 2 waiting
    assert c.due() == []
    assert c.settled(2)
    assert c.due() == [(ACK, 2, 2)]


# Every sequence of events: each publish is confirmed exactly once, in tag order, an ack never
# covers a nacked publish or one whose batch is not on disk, and nothing is left once all synced.
EVENTS = st.lists(
    st.one_of(
        st.tuples(st.just("accepted"), st.just(0)),
        st.tuples(st.just("nacked"), st.just(0)),
        st.tuples(st.just("disk"), st.integers(0, 2)),  # batch offset from the open one
        st.tuples(st.just("copies"), st.integers(1, 3)),  # stored copies settled one by one
        st.tuples(st.just("settle"), st.integers(0, 5)),  # one copy of an unsettled publish
        st.tuples(st.just("synced"), st.integers(0, 3)),
        st.tuples(st.just("due"), st.just(0)),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(EVENTS)
def test_every_publish_is_confirmed_once_and_acks_wait_for_their_disk(
    events: list[tuple[str, int]],
) -> None:
    c = Confirms()
    open_batch = 0
    synced = -1
    batch_of: dict[int, int] = {}
    nacked: set[int] = set()
    settled: dict[int, bool] = {}
    copies: dict[int, int] = {}  # seq -> copies not yet settled

    def collect() -> None:
        """What a client makes of the frames: multiple=true settles every outstanding tag."""
        for ack, first, last in c.due():
            outstanding = [s for s in range(1, c.seq + 1) if s not in settled]
            assert last in outstanding, "a tag confirmed twice"
            covered = [s for s in outstanding if s <= last] if last > first else [last]
            assert covered == list(range(first, last + 1))
            for seq in covered:
                settled[seq] = ack
                if ack:
                    assert seq not in nacked, "an ack covered a refused publish"
                    # on disk: its own batch and every batch before it
                    assert all(b <= synced for s, b in batch_of.items() if s <= seq)
                    assert not any(n for s, n in copies.items() if s <= seq), "a copy unsettled"

    for kind, arg in events:
        if kind == "accepted":
            c.accepted(c.published())
        elif kind == "nacked":
            seq = c.published()
            nacked.add(seq)
            c.nacked(seq)
        elif kind == "disk":
            open_batch = max(open_batch, synced + 1) + arg
            seq = c.published()
            batch_of[seq] = open_batch
            c.wait_disk(seq, open_batch)
        elif kind == "copies":
            seq = c.published()
            copies[seq] = arg
            c.wait_disk(seq, -1, arg)
        elif kind == "settle":
            waiting = [s for s, n in copies.items() if n]
            if waiting:
                seq = waiting[arg % len(waiting)]
                copies[seq] -= 1
                c.settled(seq)
        elif kind == "synced":
            synced = min(open_batch, synced + 1 + arg)
            c.synced(synced)
        else:
            collect()
    c.synced(open_batch)
    synced = open_batch
    for seq, n in copies.items():
        for _ in range(n):
            copies[seq] -= 1
            c.settled(seq)
    collect()
    assert sorted(settled) == list(range(1, c.seq + 1))
    assert {s for s, ack in settled.items() if not ack} == nacked
    assert c.unconfirmed == 0
