"""A channel's unsettled deliveries without a socket (broker/engine/unacked.py): the list of
the compiled build and the dict of the pure one against one model, and how big the list
stays when one delivery is never settled.

The rules a client sees (unknown tags, multiple, requeue order) are tested over sockets in
test_basic.py, test_consumer_timeouts.py and test_confirms_tx.py, on whichever build runs;
here each shape of the list (holes, tags skipped by no-ack deliveries, stragglers moved off
it) is built on purpose, and both implementations run whatever the build.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warren.broker.engine.message import Message
from warren.broker.engine.unacked import (
    INTERPRETED,
    MIN_LIMIT,
    DictUnacked,
    Unacked,
    new_unacked,
)

KINDS: list[Callable[[], Unacked]] = [Unacked, lambda: cast(Unacked, DictUnacked())]
both = pytest.mark.parametrize("make", KINDS, ids=["list", "dict"])


def message(tag: int) -> Message:
    msg = Message("", "q", b"", b"")
    msg.tag = tag
    return msg


def tags(messages: object) -> list[int]:
    return [m.tag for m in messages]  # type: ignore[attr-defined]


def test_the_build_picks_the_list_compiled_and_the_dict_interpreted() -> None:
    assert (os.environ.get("WARREN_EXPECT_COMPILED") != "1") == INTERPRETED
    assert isinstance(new_unacked(), DictUnacked) == INTERPRETED


@both
def test_put_pop_and_order(make: Callable[[], Unacked]) -> None:
    u = make()
    assert not u and len(u) == 0 and list(u.values()) == []
    for tag in (1, 2, 3, 5, 8):  # 4, 6, 7: given to no-ack deliveries
        u[tag] = message(tag)
    assert len(u) == 5 and u
    assert tags(u.values()) == [1, 2, 3, 5, 8]
    assert 4 not in u and 5 in u and 9 not in u and 0 not in u
    popped = u.pop(3, None)
    assert popped is not None and popped.tag == 3
    for gone in (3, 4, 0, 2**64):
        assert u.pop(gone, None) is None
    assert tags(u.pop_upto(5)) == [1, 2, 5]
    assert tags(u.pop_upto(7)) == []
    assert tags(u.pop_all()) == [8]
    assert not u
    u[9] = message(9)  # tags go on after a pop_all
    assert tags(u.values()) == [9] and 9 in u


@both
def test_restore_puts_settled_deliveries_back_in_tag_order(make: Callable[[], Unacked]) -> None:
    """A tx rollback puts settled deliveries back under their own tags."""
    u = make()
    for t in range(1, 7):
        u[t] = message(t)
    five = u.pop(5, None)
    assert five is not None
    settled = [five, *u.pop_upto(2)]
    u.restore(settled)
    assert tags(u.values()) == [1, 2, 3, 4, 5, 6] and len(u) == 6
    assert tags(u.pop_upto(4)) == [1, 2, 3, 4]


def test_restore_under_tags_moved_off_the_list() -> None:
    u = Unacked()
    u[1] = message(1)
    u[2] = message(2)
    for tag in range(3, 3 * MIN_LIMIT):  # 1 and 2 end up off the list
        u[tag] = message(tag)
        assert u.pop(tag, None) is not None
    assert u._old
    two, one = u.pop(2, None), u.pop(1, None)
    assert one is not None and two is not None and not u
    u.restore([two])
    u.restore([one])
    u[3 * MIN_LIMIT] = message(3 * MIN_LIMIT)
    assert tags(u.values()) == [1, 2, 3 * MIN_LIMIT]
    assert tags(u.pop_upto(2)) == [1, 2]


def test_one_straggler_while_millions_pass_keeps_the_list_small() -> None:
    """The oldest delivery is never settled while a million others are, one by one: the
    list does not keep a slot for each (it would pin 8 MB of holes)."""
    u = Unacked()
    u[1] = message(1)
    for tag in range(2, 1_000_001):
        u[tag] = message(tag)
        assert u.pop(tag, None) is not None
        assert len(u._slots) <= MIN_LIMIT  # the bound is the point
    u[1_000_001] = message(1_000_001)
    assert len(u) == 2 and tags(u.values()) == [1, 1_000_001]
    assert 1 in u and 2 not in u
    assert tags(u.pop_upto(1_000_001)) == [1, 1_000_001]
    assert not u


def test_many_stragglers_spread_among_settled_ones_stay_bounded() -> None:
    """Every 100th delivery is held (a slow consumer beside a fast one on one channel):
    the list stays within eight slots per live delivery, or MIN_LIMIT."""
    u = Unacked()
    held = []
    for tag in range(1, 200_001):
        u[tag] = message(tag)
        if tag % 100:
            assert u.pop(tag, None) is not None
        else:
            held.append(tag)
        assert len(u._slots) <= max(MIN_LIMIT, 8 * len(u))
    assert tags(u.values()) == held
    assert u.pop(100, None) is not None and 100 not in u  # settled from the side dict
    assert tags(u.pop_upto(150_000)) == held[1:1500]
    assert tags(u.pop_all()) == held[1500:]


def test_many_unsettled_grow_the_list_without_moving_them() -> None:
    """prefetch 0 and no acks: the live deliveries fill the list, none is moved off it."""
    u = Unacked()
    for tag in range(1, 50_001):
        u[tag] = message(tag)
    assert len(u) == 50_000 and not u._old
    assert tags(u.pop_upto(50_000)) == list(range(1, 50_001))


# A model: the dict keyed by tag the channel kept before (insertion order: tag order).
ops = st.lists(
    st.tuples(
        st.sampled_from(["deliver", "skip", "pop", "upto", "all", "back"]), st.integers(0, 60)
    ),
    max_size=400,
)


@both
@settings(max_examples=200, deadline=None)
@given(script=ops)
def test_behaves_as_the_dict_it_replaces(
    make: Callable[[], Unacked], script: list[tuple[str, int]]
) -> None:
    u = make()
    model: dict[int, Message] = {}
    next_tag = 0
    settled: list[Message] = []  # for "back": a rollback puts these under their tags
    for op, arg in script:
        if op == "deliver":
            for _ in range(arg % 40 + 1):
                next_tag += 1
                m = message(next_tag)
                u[next_tag] = m
                model[next_tag] = m
        elif op == "skip":  # tags given to no-ack deliveries
            next_tag += arg * 50
        elif op == "pop":
            tag = max(1, next_tag - arg)
            one = u.pop(tag, None)
            assert one is model.pop(tag, None)
            if one is not None:
                settled.append(one)
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
            u.restore(settled)
            for m in settled:
                model[m.tag] = m
            model = dict(sorted(model.items()))
            settled = []
        assert len(u) == len(model) and bool(u) == bool(model)
        assert list(u.values()) == list(model.values())
        for t in range(max(0, next_tag - 70), next_tag + 2):
            assert (t in u) == (t in model)
