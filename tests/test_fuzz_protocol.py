"""Property tests of protocol/ (sans-IO): any byte stream ends in events or an AMQPError.

What must hold for every input, random or mutated from a real client's
session (``fuzz_support.Driver`` asserts it as it goes):

* nothing but ``ChannelError``/``ConnectionError_`` escapes, with a reply
  code of the right scope (soft codes close a channel, hard codes the
  connection) and a reply text in RabbitMQ's ``NAME - detail`` form;
* after a connection error nothing more is parsed and nothing is kept;
* at most one frame waits unparsed and at most one message body per channel
  is held, so a peer cannot make the broker buffer without bound;
* a message handed to the broker has well-formed properties;
* how the bytes are cut into reads changes nothing.

CI runs a fixed, bounded set of examples (``derandomize``); set
``WARREN_FUZZ_EXAMPLES`` for a longer random run, or see ``make fuzz``.
"""

from __future__ import annotations

import contextlib
import os
import struct
import time

import pytest
from fuzz_support import (
    Driver,
    Outcome,
    check_error,
    drive,
    field_tables,
    frame,
    load_seeds,
    method_payloads,
    mutated_sessions,
    nested_table,
    random_streams,
    split_frames,
    table_bytes,
)
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from pamqp import commands

from warren.protocol.connection import NEED_DATA, OPEN, ProtocolConnection
from warren.protocol.constants import FRAME_ERROR, PROTOCOL_HEADER
from warren.protocol.errors import ConnectionError_, truncate_reply_text
from warren.protocol.methods import decode_method, encode_method_payload
from warren.protocol.properties import (
    PropertiesError,
    read_properties,
    set_header,
    split_properties,
)
from warren.protocol.tables import (
    MAX_DEPTH,
    TableError,
    decode_table,
    encode_key,
    encode_table,
    encode_value,
    table_entries,
)

SEEDS = load_seeds()
LONG_RUN = int(os.environ.get("WARREN_FUZZ_EXAMPLES", "0"))


def fuzz_settings(examples: int) -> settings:
    """Bounded and repeatable in CI; ``WARREN_FUZZ_EXAMPLES=N`` for a long random run."""
    return settings(
        max_examples=LONG_RUN or examples,
        derandomize=not LONG_RUN,
        database=None,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


def record(outcome: Outcome) -> None:
    """What the input came to, for ``--hypothesis-show-statistics``."""
    if outcome.error is not None:
        event(outcome.error.text.split(" - ")[0] + " " + outcome.error.text.split(":")[-1][:30])
    else:
        event("channel error" if outcome.channel_errors else (outcome.events or ["none"])[-1])


# ---- seeds -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(SEEDS))
def test_seed_replays_without_error(name: str) -> None:
    """The recorded sessions are valid: the baseline every mutation departs from."""
    outcome = drive(SEEDS[name])
    assert outcome.error is None and not outcome.channel_errors
    assert outcome.events[0] == "header" and outcome.events[-1] == "0:Connection.Close"
    assert any(e.endswith(":content:0") or ":content:" in e for e in outcome.events)


# ---- whole streams -----------------------------------------------------------------------


@fuzz_settings(250)
@given(data=st.data())
def test_mutated_sessions(data: st.DataObject) -> None:
    stream = data.draw(mutated_sessions(SEEDS))
    chunks = data.draw(st.lists(st.integers(1, 3000), max_size=6))
    record(drive(stream, chunks))


@fuzz_settings(150)
@given(data=st.data())
def test_random_streams(data: st.DataObject) -> None:
    stream = data.draw(random_streams(SEEDS))
    record(drive(stream, data.draw(st.lists(st.integers(1, 500), max_size=4))))


@fuzz_settings(100)
@given(stream=mutated_sessions(SEEDS), cuts=st.lists(st.integers(1, 200), max_size=30))
def test_chunking_changes_nothing(stream: bytes, cuts: list[int]) -> None:
    whole = drive(stream)
    pieces = drive(stream, cuts)
    assert pieces.events == whole.events
    assert (pieces.error and pieces.error.text) == (whole.error and whole.error.text)


@fuzz_settings(60)
@given(stream=mutated_sessions(SEEDS), extra=st.binary(min_size=1, max_size=5000))
def test_nothing_is_kept_after_a_connection_error(stream: bytes, extra: bytes) -> None:
    driver = Driver()
    driver.feed(stream + b"\x00" * 8)  # 8 zero octets: a frame error if nothing else was
    if driver.proto.failed:
        for _ in range(3):
            driver.feed(extra)  # asserts that the buffer does not grow


# ---- limits ------------------------------------------------------------------------------


def opened_connection(frame_max: int = 131072, max_message_size: int = 1 << 20) -> Driver:
    """A Driver past the handshake of the pika seed (tuned to ``frame_max``), channel 1 open."""
    _, frames, _ = split_frames(SEEDS["pika_session"])
    start_ok, _, open_ = (f.encode() for f in frames[:3])
    tune_ok = frame(1, 0, encode_method_payload(commands.Connection.TuneOk(2047, frame_max, 0)))
    driver = Driver(frame_max, max_message_size)
    driver.feed(PROTOCOL_HEADER + start_ok + tune_ok + open_ + frame(1, 1, b"\x00\x14\x00\x0a\x00"))
    assert driver.proto.state is OPEN and 1 in driver.proto.channels, driver.events
    return driver


def test_a_frame_dripped_one_octet_at_a_time_costs_linear_time() -> None:
    """A frame sent an octet per read must not be re-copied on every read (quadratic time)."""
    driver = opened_connection(frame_max=2**20)  # as a broker with frame_max = 1MiB would
    proto = driver.proto
    payload = b"\x00\x32\x00\x0a\x00\x00\x00" + b"\x00" * (proto.frame_max - 7)
    data = struct.pack(">BHI", 1, 1, len(payload)) + payload  # frame end withheld
    # this process's CPU time, not the wall clock: a guard against quadratic work (a copy of
    # the partial frame per read took ~1 min), which other jobs on the machine cannot trip
    started = time.process_time()
    for i in range(len(data)):
        proto.receive_data(data[i : i + 1])
        assert proto.next_event() is NEED_DATA
    elapsed = time.process_time() - started
    assert proto.buffered == len(data)
    # ~0.5 s of CPU when each octet costs O(1)
    assert elapsed < 5, f"{len(data)} one-octet reads took {elapsed:.1f} s of CPU"


@pytest.mark.parametrize("levels", [MAX_DEPTH, MAX_DEPTH + 1, MAX_DEPTH + 2, 3000])
@pytest.mark.parametrize("arrays", [False, True])
def test_nesting_limit(levels: int, arrays: bool) -> None:
    """MAX_DEPTH levels below the top table decode; one more is refused, never recursed into."""
    raw = nested_table(levels, arrays)
    if levels <= MAX_DEPTH + 1:
        assert decode_table(raw)[1] == len(raw)
    else:
        with pytest.raises(TableError, match="nested too deeply"):
            decode_table(raw)


def test_deeply_nested_arguments_close_the_connection_with_syntax_or_frame_error() -> None:
    driver = opened_connection(frame_max=2**20)
    args = b"\x00\x00" + b"\x01q" + b"\x00" + nested_table(3000)
    driver.feed(frame(1, 1, b"\x00\x32\x00\x0a" + args))  # queue.declare
    assert driver.error is not None and driver.error.code == FRAME_ERROR, driver.events


def test_deeply_nested_message_headers_close_the_connection() -> None:
    driver = opened_connection(frame_max=2**20)
    props = struct.pack(">H", 0x2000) + nested_table(MAX_DEPTH + 5)
    driver.feed(
        frame(1, 1, b"\x00\x3c\x00\x28\x00\x00\x00\x01q\x00")
        + frame(2, 1, struct.pack(">HHQ", 60, 0, 0) + props)
    )
    assert driver.error is not None, driver.events
    assert driver.error.text.startswith("SYNTAX_ERROR - "), driver.error.text


@pytest.mark.parametrize(
    "props",
    [
        struct.pack(">H", 0x2000) + b"\x00\x00\x00\x10abc",  # headers longer than the frame
        struct.pack(">H", 0x2000) + table_bytes([(b"k", b"S\xff\xff\xff\xff")]),  # value overruns
        struct.pack(">H", 0x2000) + table_bytes([(b"k", b"Z")]),  # unknown field type
        struct.pack(">H", 0x8000) + b"\x09ab",  # content-type runs past the end
        struct.pack(">H", 0x0040) + b"\x00\x00",  # timestamp cut short
        struct.pack(">H", 0x0001),  # a continuation flag word that never comes
    ],
)
def test_malformed_properties_close_the_connection(props: bytes) -> None:
    """A broken content header never reaches the broker, where a later read would fail."""
    driver = opened_connection()
    driver.feed(
        frame(1, 1, b"\x00\x3c\x00\x28\x00\x00\x00\x01q\x00")
        + frame(2, 1, struct.pack(">HHQ", 60, 0, 1) + props)
        + frame(3, 1, b"x")
    )
    assert driver.error is not None, driver.events
    assert driver.error.text.startswith("SYNTAX_ERROR - content header properties"), driver.error
    assert (driver.error.class_id, driver.error.method_id) == (60, 40)


def test_oversized_message_is_a_channel_error_and_the_connection_goes_on() -> None:
    driver = opened_connection(max_message_size=100)
    publish = frame(1, 1, b"\x00\x3c\x00\x28\x00\x00\x00\x01q\x00")
    driver.feed(publish + frame(2, 1, struct.pack(">HHQH", 60, 0, 101, 0)) + frame(3, 1, b"x"))
    assert driver.channel_errors == [(1, 406)]
    driver.feed(frame(1, 1, b"\x00\x14\x00\x29"))  # channel.close-ok
    driver.feed(frame(1, 1, b"\x00\x14\x00\x0a\x00") + frame(8, 0, b""))
    assert driver.error is None and driver.events[-1] == "1:Channel.Open"


# ---- the decoders on their own -------------------------------------------------------------


@fuzz_settings(300)
@given(raw=st.binary(max_size=300) | field_tables())
@example(raw=b"\x00\x00\x00\x05\x01kF\x00\x00")
@example(raw=b"\x00\x00\x00\x03\x05abc")
def test_table_decoders_raise_only_table_error(raw: bytes) -> None:
    for decode in (decode_table, table_entries):
        with contextlib.suppress(TableError):
            decode(raw)


@fuzz_settings(200)
@given(raw=st.binary(max_size=200))
@example(raw=b"\x20\x00\x00\x00\x00\x05\x01kS\x00")
def test_property_readers_raise_only_properties_error(raw: bytes) -> None:
    try:
        read_properties(raw)
    except PropertiesError:
        return
    # what reads cleanly can also be edited: the broker adds headers to such messages
    split_properties(set_header(raw, "x-delivery-count", 1))


@fuzz_settings(300)
@given(payload=method_payloads() | st.binary(min_size=4, max_size=80))
def test_method_decoder_raises_only_connection_errors(payload: bytes) -> None:
    try:
        decode_method(payload)
    except ConnectionError_ as exc:
        check_error(exc, frozenset({501, 540}))


value_trees = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.text(max_size=20)
    | st.binary(max_size=20)
    | st.floats(allow_nan=False),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=20,
)


@fuzz_settings(200)
@given(table=st.dictionaries(st.text(max_size=10), value_trees, max_size=5))
def test_tables_round_trip(table: dict[str, object]) -> None:
    raw = encode_table(table)
    decoded, end = decode_table(raw)
    assert end == len(raw)
    assert decoded == table
    assert encode_table(decoded) == raw


def test_unparsed_input_is_reported() -> None:
    proto = ProtocolConnection(4096, 100)
    proto.receive_data(PROTOCOL_HEADER[:5])
    assert proto.next_event() is NEED_DATA and proto.buffered == 5


@pytest.mark.parametrize("raw", [b"q\xbe", b"\xff" * 300, "é".encode() * 200])
def test_names_that_are_not_utf8(raw: bytes) -> None:
    """Names are read with surrogateescape: a header keeps their octets, a reply text is UTF-8."""
    name = raw.decode("utf-8", "surrogateescape")
    assert encode_value(name) == b"S" + struct.pack(">I", len(raw)) + raw
    assert encode_value([name]) == b"A" + struct.pack(">I", 5 + len(raw)) + encode_value(name)
    key = name[:50].encode("utf-8", "surrogateescape")
    assert encode_key(name[:50]) == bytes([len(key)]) + key
    text = truncate_reply_text(f"NOT_FOUND - no queue '{name}'")
    assert len(text.encode()) <= 255  # encodes strictly: valid UTF-8
