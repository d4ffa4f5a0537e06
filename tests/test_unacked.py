"""A channel's unsettled deliveries without a socket (broker/engine/unacked.py): the map a
dict keyed by tag used to be, and how big it stays when one delivery is never settled.

The rules a client sees (unknown tags, multiple, requeue order) are tested over sockets in
test_basic.py, test_consumer_timeouts.py and test_confirms_tx.py; here each shape of the
list (holes, tags skipped by no-ack deliveries, stragglers moved off it) is built on purpose.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from warren.broker.engine.message import Message
from warren.broker.engine.unacked import MIN_LIMIT, Unacked


def message(tag: int) -> Message:
    msg = Message("", "q", b"", b"")
    msg.tag = tag
    return msg


def tags(messages: list[Message]) -> list[int]:
    return [m.tag for m in messages]


def test_put_pop_and_order() -> None:
    u = Unacked()
    assert not u and len(u) == 0 and list(u) == []
    for tag in (1, 2, 3, 5, 8):  # 4, 6, 7: given to no-ack deliveries
        u.put(tag, message(tag))
    assert len(u) == 5 and u
    assert tags(list(u)) == [1, 2, 3, 5, 8]
    assert 4 not in u and 5 in u and 9 not in u and 0 not in u
    popped = u.pop(3)
    assert popped is not None and popped.tag == 3
    assert u.pop(3) is None and u.pop(4) is None and u.pop(0) is None and u.pop(2**64) is None
    assert tags(u.pop_upto(5)) == [1, 2, 5]
    assert tags(u.pop_upto(7)) == []
    assert tags(u.pop_all()) == [8]
    assert not u
    u.put(9, message(9))  # tags go on after a pop_all
    assert tags(list(u)) == [9] and 9 in u


def test_put_back_under_old_tags_keeps_tag_order() -> None:
    """A tx rollback puts settled deliveries back under their own tags."""
    u = Unacked()
    msgs = [message(t) for t in range(1, 7)]
    for m in msgs:
        u.put(m.tag, m)
    settled = [*u.pop_upto(2), u.pop(5)]
    for m in settled:
        assert m is not None
        u.put(m.tag, m)
    assert tags(list(u)) == [1, 2, 3, 4, 5, 6] and len(u) == 6


def test_put_back_under_tags_moved_off_the_list() -> None:
    u = Unacked()
    u.put(1, message(1))
    u.put(2, message(2))
    for tag in range(3, 3 * MIN_LIMIT):  # 1 and 2 end up off the list
        u.put(tag, message(tag))
        assert u.pop(tag) is not None
    assert u._old
    two, one = u.pop(2), u.pop(1)
    assert one is not None and two is not None and not u
    u.put(2, two)
    u.put(1, one)
    u.put(3 * MIN_LIMIT, message(3 * MIN_LIMIT))
    assert tags(list(u)) == [1, 2, 3 * MIN_LIMIT]
    assert tags(u.pop_upto(2)) == [1, 2]


def test_one_straggler_while_millions_pass_keeps_the_list_small() -> None:
    """The oldest delivery is never settled while a million others are, one by one: the
    list does not keep a slot for each (it would pin 8 MB of holes)."""
    u = Unacked()
    u.put(1, message(1))
    for tag in range(2, 1_000_001):
        u.put(tag, message(tag))
        assert u.pop(tag) is not None
        assert len(u._slots) <= MIN_LIMIT  # the bound is the point
    u.put(1_000_001, message(1_000_001))
    assert len(u) == 2 and tags(list(u)) == [1, 1_000_001]
    assert 1 in u and 2 not in u
    assert tags(u.pop_upto(1_000_001)) == [1, 1_000_001]
    assert not u


def test_many_stragglers_spread_among_settled_ones_stay_bounded() -> None:
    """Every 100th delivery is held (a slow consumer beside a fast one on one channel):
    the list stays within eight slots per live delivery, or MIN_LIMIT."""
    u = Unacked()
    held = []
    for tag in range(1, 200_001):
        u.put(tag, message(tag))
        if tag % 100:
            assert u.pop(tag) is not None
        else:
            held.append(tag)
        assert len(u._slots) <= max(MIN_LIMIT, 8 * len(u))
    assert tags(list(u)) == held
    assert u.pop(100) is not None and 100 not in u  # settled from the side dict
    assert tags(u.pop_upto(150_000)) == held[1:1500]
    assert tags(u.pop_all()) == held[1500:]


def test_many_unsettled_grow_the_list_without_moving_them() -> None:
    """prefetch 0 and no acks: the live deliveries fill the list, none is moved off it."""
    u = Unacked()
    for tag in range(1, 50_001):
        u.put(tag, message(tag))
    assert len(u) == 50_000 and not u._old
    assert tags(u.pop_upto(50_000)) == list(range(1, 50_001))


# A model: the dict keyed by tag the channel used to keep (insertion order: tag order).
ops = st.lists(
    st.tuples(
        st.sampled_from(["deliver", "skip", "pop", "upto", "all", "back"]), st.integers(0, 60)
    ),
    max_size=400,
)


@settings(max_examples=300, deadline=None)
@given(ops)
def test_behaves_as_the_dict_it_replaces(script: list[tuple[str, int]]) -> None:
    u = Unacked()
    model: dict[int, Message] = {}
    next_tag = 0
    settled: list[Message] = []  # for "back": a rollback puts these under their tags
    for op, arg in script:
        if op == "deliver":
            for _ in range(arg % 40 + 1):
                next_tag += 1
                m = message(next_tag)
                u.put(next_tag, m)
                model[next_tag] = m
        elif op == "skip":  # tags given to no-ack deliveries
            next_tag += arg * 50
        elif op == "pop":
            tag = max(1, next_tag - arg)
            got = u.pop(tag)
            assert got is model.pop(tag, None)
            if got is not None:
                settled.append(got)
        elif op == "upto":
            tag = max(0, next_tag - arg * 3)
            want = [m for t, m in model.items() if t <= tag]
            for m in want:
                del model[m.tag]
            got = u.pop_upto(tag)
            assert got == want
            settled.extend(got)
        elif op == "all":
            got = u.pop_all()
            assert got == list(model.values())
            model.clear()
            settled.extend(got)
        else:
            for m in settled:
                u.put(m.tag, m)
                model[m.tag] = m
            model = dict(sorted(model.items()))
            settled = []
        assert len(u) == len(model)
        assert list(u) == list(model.values())
        for t in range(max(0, next_tag - 70), next_tag + 2):
            assert (t in u) == (t in model)
