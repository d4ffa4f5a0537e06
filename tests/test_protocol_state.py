"""The protocol's state machine (protocol/connection.py), driven with byte strings only.

The broker's part is played with ``ProtocolConnection.send``; the orderings here (crossing
closes, frames between a close and its close-ok, methods out of turn in every handshake
state) are the ones a socket test cannot arrange, because the broker answers at once.
"""

from __future__ import annotations

import pytest
from pamqp import commands
from test_protocol import channel_close, events, frame, handshaken, method, open_channel, opened

from warren.protocol import (
    NEED_DATA,
    ChannelState,
    ConnectionError_,
    ConnectionState,
    Content,
    LocalProtocolError,
    ProtocolConnection,
    Sentinel,
)
from warren.protocol.constants import PROTOCOL_HEADER

Conn = ProtocolConnection[None]


def publish(channel: int) -> bytes:
    """basic.publish to queue "q", its content header and a one-octet body."""
    payload = b"\x00\x3c\x00\x28\x00\x00\x00\x01q\x00"
    header = b"\x00\x3c\x00\x00" + (1).to_bytes(8, "big") + b"\x00\x00"
    return frame(1, channel, payload) + frame(2, channel, header) + frame(3, channel, b"z")


def raises(conn: Conn) -> ConnectionError_:
    with pytest.raises(ConnectionError_) as info:
        conn.next_event()
    return info.value


# ---- the handshake ---------------------------------------------------------------------------


def test_handshake_moves_through_the_states_and_tune_ok_sets_the_limits() -> None:
    conn: Conn = ProtocolConnection(131072, 1 << 20)
    assert conn.state is ConnectionState.HEADER
    conn.receive_data(PROTOCOL_HEADER)
    assert conn.next_event() is Sentinel.PROTOCOL_HEADER
    conn.send(0, commands.Connection.Start())
    assert conn.state is ConnectionState.STARTING
    conn.receive_data(method(0, commands.Connection.StartOk(response="\0u\0p")))
    assert events(conn) and conn.state is ConnectionState.STARTING  # the login is the broker's
    conn.send(0, commands.Connection.Tune(2047, 131072, 60))
    assert conn.state is ConnectionState.TUNING
    conn.receive_data(method(0, commands.Connection.TuneOk(100, 8192, 15)))
    assert events(conn) and conn.state is ConnectionState.OPENING
    assert (conn.channel_max, conn.frame_max, conn.heartbeat) == (100, 8192, 15)
    conn.receive_data(method(0, commands.Connection.Open()))
    assert events(conn) and conn.state is ConnectionState.OPENING
    # the broker's bytes are the method's frame, as method_frame encodes it
    assert conn.send(0, commands.Connection.OpenOk()) == b"\x01\x00\x00\x00\x00\x00\x05" + (
        b"\x00\x0a\x00\x29\x00\xce"
    )
    assert conn.state is ConnectionState.OPEN


def test_tune_ok_of_zero_means_no_limit() -> None:
    conn: Conn = ProtocolConnection(2**31, 1 << 20)
    conn.receive_data(PROTOCOL_HEADER)
    conn.next_event()
    conn.send(0, commands.Connection.Start())
    conn.receive_data(method(0, commands.Connection.StartOk()))
    conn.next_event()
    conn.send(0, commands.Connection.Tune(0, 0, 0))
    conn.receive_data(method(0, commands.Connection.TuneOk(0, 0, 0)))
    conn.next_event()
    assert (conn.channel_max, conn.frame_max) == (65535, 2**32 - 1)


def _tuning(channel_max: int = 2047, frame_max: int = 131072) -> Conn:
    conn: Conn = ProtocolConnection(frame_max, 1 << 20)
    conn.receive_data(PROTOCOL_HEADER)
    conn.next_event()
    conn.send(0, commands.Connection.Start())
    conn.receive_data(method(0, commands.Connection.StartOk()))
    conn.next_event()
    conn.send(0, commands.Connection.Tune(channel_max, frame_max, 60))
    return conn


# rabbit_reader:validate_negotiated_integer_value/3 and fail_negotiation/4 (v4.3.5): the
# minimum is ?FRAME_MIN_SIZE (8192 since 4.1) and ?CHANNEL_MIN (1); 0 asks for no limit,
# refused where the broker offered one; the error names connection.tune (10, 30)
@pytest.mark.parametrize(
    ("channel_max", "frame_max", "text"),
    [
        (
            10,
            131073,
            "NOT_ALLOWED - negotiated frame_max = 131073 is higher than the maximum "
            "allowed value (131072)",
        ),
        (
            10,
            0,
            "NOT_ALLOWED - negotiated frame_max = 0 is higher than the maximum allowed "
            "value (131072)",
        ),
        (
            10,
            8191,
            "NOT_ALLOWED - negotiated frame_max = 8191 is lower than the minimum "
            "allowed value (8192)",
        ),
        (
            10,
            4096,
            "NOT_ALLOWED - negotiated frame_max = 4096 is lower than the minimum "
            "allowed value (8192)",
        ),
        (
            0,
            8192,
            "NOT_ALLOWED - negotiated channel_max = 0 (no limit) is higher than the "
            "maximum allowed value (2047)",
        ),
        (
            2048,
            8192,
            "NOT_ALLOWED - negotiated channel_max = 2048 is higher than the maximum "
            "allowed value (2047)",
        ),
    ],
)
def test_tune_ok_beyond_the_brokers_offer_is_refused(
    channel_max: int, frame_max: int, text: str
) -> None:
    conn = _tuning()
    conn.receive_data(method(0, commands.Connection.TuneOk(channel_max, frame_max, 0)))
    error = raises(conn)
    assert (error.code, error.text, error.class_id, error.method_id) == (530, text, 10, 30)
    assert conn.state is ConnectionState.TUNING  # not tuned: the broker just closes the socket


@pytest.mark.parametrize(
    ("steps", "sent", "name"),
    [
        (0, commands.Connection.Open(), "starting"),
        (0, commands.Connection.TuneOk(), "starting"),
        (1, commands.Connection.StartOk(), "tuning"),  # start-ok twice
        (1, commands.Connection.Close(), "tuning"),
        (2, commands.Connection.TuneOk(), "opening"),  # tune-ok twice
        (2, commands.Connection.Close(), "opening"),  # close before open is refused too
        (2, commands.Connection.UpdateSecret(), "opening"),
        (3, commands.Connection.Open(), "running"),
        (3, commands.Basic.Qos(), "running"),  # a channel method on channel 0
    ],
)
def test_connection_method_out_of_turn_is_504_naming_rabbitmqs_state(
    steps: int, sent: object, name: str
) -> None:
    """rabbit_reader:handle_method0/2's last clause; the stream stays readable."""
    conn = _tuning() if steps else ProtocolConnection(131072, 1 << 20)
    if not steps:
        conn.receive_data(PROTOCOL_HEADER)
        conn.next_event()
        conn.send(0, commands.Connection.Start())
    if steps >= 2:
        conn.receive_data(method(0, commands.Connection.TuneOk(2047, 131072, 0)))
        conn.next_event()
    if steps >= 3:
        conn.receive_data(method(0, commands.Connection.Open()))
        conn.next_event()
        conn.send(0, commands.Connection.OpenOk())
    if steps == 1:  # start-ok was answered with tune: state TUNING
        assert conn.state is ConnectionState.TUNING
    conn.receive_data(method(0, sent))
    error = raises(conn)
    assert error.code == 504
    assert error.text == f"CHANNEL_ERROR - unexpected method in connection state {name}"
    index = sent.index  # type: ignore[attr-defined]
    assert (error.class_id, error.method_id) == (index >> 16, index & 0xFFFF)
    assert not conn.failed  # a whole frame was read: the client's close-ok can still come
    if conn.state is ConnectionState.OPENING or conn.state is ConnectionState.OPEN:
        conn.send(0, commands.Connection.Close(504, error.text, *divmod(index, 65536)))
        conn.receive_data(method(0, commands.Connection.CloseOk()))
        ((channel, ok),) = events(conn)  # type: ignore[misc]
        assert channel == 0 and isinstance(ok, commands.Connection.CloseOk)


def test_channel_frames_before_open_ok_are_unexpected() -> None:
    conn = _tuning()
    conn.receive_data(method(1, commands.Channel.Open()))
    error = raises(conn)
    assert (error.code, error.text) == (505, "UNEXPECTED_FRAME - type 1, all octets = "
                                        "<<0,20,0,10,1,48>>")  # fmt: skip
    assert conn.failed


# ---- what the broker may send ----------------------------------------------------------------


def _refused(conn: Conn, channel: int, sent: object) -> None:
    """``send`` refuses ``sent`` and changes nothing."""
    before = (conn.state, {n: r.state for n, r in conn.channels.items()})
    with pytest.raises(LocalProtocolError):
        conn.send(channel, sent)
    assert (conn.state, {n: r.state for n, r in conn.channels.items()}) == before


def test_handshake_methods_can_be_sent_once_and_in_order() -> None:
    conn: Conn = ProtocolConnection(131072, 1 << 20)
    _refused(conn, 0, commands.Connection.Start())  # the header has not come
    _refused(conn, 0, commands.Connection.Close())
    conn.receive_data(PROTOCOL_HEADER)
    conn.next_event()
    conn.send(0, commands.Connection.Start())
    _refused(conn, 0, commands.Connection.Start())
    _refused(conn, 0, commands.Connection.OpenOk())
    _refused(conn, 0, commands.Connection.Blocked())
    conn.send(0, commands.Connection.Tune(2047, 131072, 60))
    _refused(conn, 0, commands.Connection.Tune(2047, 131072, 60))
    _refused(conn, 0, commands.Connection.OpenOk())  # tune-ok has not come
    _refused(conn, 0, commands.Connection.CloseOk())  # no close to answer


def test_a_refused_login_may_be_reported_before_tuning() -> None:
    """authentication_failure_close: RabbitMQ's one connection.close before tuning."""
    conn: Conn = ProtocolConnection(131072, 1 << 20)
    conn.receive_data(PROTOCOL_HEADER)
    conn.next_event()
    conn.send(0, commands.Connection.Start())
    conn.receive_data(method(0, commands.Connection.StartOk()))
    conn.next_event()
    conn.stop()  # the broker ignores the peer while it waits to answer
    conn.receive_data(method(0, commands.Connection.StartOk()))
    assert conn.next_event() is NEED_DATA
    conn.send(0, commands.Connection.Close(403, "ACCESS_REFUSED - Login was refused", 0, 0))
    assert conn.state is ConnectionState.CLOSING


def test_methods_on_channels_need_an_open_channel() -> None:
    conn = handshaken()
    _refused(conn, 3, commands.Basic.QosOk())  # never opened
    _refused(conn, 3, commands.Channel.OpenOk())
    conn.receive_data(method(3, commands.Channel.Open()))
    events(conn)
    assert conn.channels[3].state is ChannelState.OPENING
    _refused(conn, 3, commands.Basic.QosOk())  # open-ok first
    _refused(conn, 3, channel_close())
    conn.send(3, commands.Channel.OpenOk())
    _refused(conn, 3, commands.Channel.OpenOk())
    _refused(conn, 3, commands.Channel.CloseOk())  # no close to answer
    conn.send(3, commands.Basic.QosOk())


def test_nothing_may_be_sent_on_a_channel_the_broker_is_closing() -> None:
    conn = opened()
    conn.send(1, channel_close())
    assert conn.channels[1].state is ChannelState.CLOSE_SENT
    _refused(conn, 1, commands.Basic.ConsumeOk(consumer_tag="c"))
    _refused(conn, 1, channel_close())  # one close is enough
    _refused(conn, 1, commands.Channel.OpenOk())


def test_after_connection_close_no_channel_method_may_be_sent() -> None:
    conn = opened()
    conn.send(0, commands.Connection.Close(541, "INTERNAL_ERROR - x", 0, 0))
    _refused(conn, 1, commands.Basic.QosOk())
    _refused(conn, 1, channel_close())
    _refused(conn, 0, commands.Connection.Close(541, "INTERNAL_ERROR - x", 0, 0))
    _refused(conn, 0, commands.Connection.Unblocked())


# ---- channels --------------------------------------------------------------------------------


@pytest.mark.parametrize("state", ["opening", "open", "close-sent"])
def test_channel_open_on_a_used_number_is_504(state: str) -> None:
    """rabbit_channel: "second 'channel.open' seen", checked before the closing state."""
    conn = handshaken()
    conn.receive_data(method(1, commands.Channel.Open()))
    events(conn)
    if state != "opening":
        conn.send(1, commands.Channel.OpenOk())
    if state == "close-sent":
        conn.send(1, channel_close())
    conn.receive_data(method(1, commands.Channel.Open()))
    error = raises(conn)
    assert (error.code, error.text) == (504, "CHANNEL_ERROR - second 'channel.open' seen")
    assert (error.class_id, error.method_id) == (20, 10)


def test_crossing_channel_closes_each_get_close_ok() -> None:
    """The broker closes channel 1 while the client's own close is on its way."""
    conn = opened()
    conn.send(1, channel_close())
    conn.receive_data(method(1, commands.Channel.Close(200, "bye", 0, 0)))
    ((channel, close),) = events(conn)  # type: ignore[misc]
    assert channel == 1 and isinstance(close, commands.Channel.Close)
    conn.send(1, commands.Channel.CloseOk())  # theirs is answered; ours still waits
    assert conn.channels[1].state is ChannelState.CLOSE_SENT
    conn.receive_data(publish(1) + method(1, commands.Channel.Open()))
    assert raises(conn).code == 504  # the number is not free before our close-ok
    conn = opened()
    conn.send(1, channel_close())
    conn.receive_data(method(1, commands.Channel.Close(200, "bye", 0, 0)))
    events(conn)
    conn.send(1, commands.Channel.CloseOk())
    conn.receive_data(publish(1) + method(1, commands.Channel.CloseOk()))
    ((channel, ok),) = events(conn)  # type: ignore[misc]
    assert channel == 1 and isinstance(ok, commands.Channel.CloseOk)
    assert 1 not in conn.channels
    open_channel(conn, 1)  # free again


def test_frames_after_the_clients_channel_close_are_dropped_until_close_ok() -> None:
    conn = opened()
    open_channel(conn, 2)
    conn.receive_data(
        method(1, commands.Channel.Close(200, "bye", 0, 0))
        + publish(1)
        + method(1, commands.Basic.Qos())
        + method(1, commands.Channel.Close(200, "again", 0, 0))
        + publish(2)
    )
    close, content = events(conn)
    assert close[0] == 1 and isinstance(close[1], commands.Channel.Close)  # type: ignore[index]
    assert isinstance(content, Content) and content.channel == 2
    assert conn.channels[1].state is ChannelState.CLOSE_RECEIVED
    _refused(conn, 1, commands.Basic.QosOk())
    conn.send(1, commands.Channel.CloseOk())
    assert 1 not in conn.channels  # close-ok frees the number
    _refused(conn, 1, commands.Channel.CloseOk())


def test_close_ok_on_an_open_channel_goes_to_the_broker() -> None:
    """Not the protocol's to refuse: the broker answers it as RabbitMQ does (540)."""
    conn = opened()
    conn.receive_data(method(1, commands.Channel.CloseOk()))
    ((channel, ok),) = events(conn)  # type: ignore[misc]
    assert channel == 1 and isinstance(ok, commands.Channel.CloseOk)
    assert conn.channels[1].state is ChannelState.OPEN


# ---- closing the connection ------------------------------------------------------------------


def test_after_the_brokers_connection_close_only_close_and_close_ok_are_read() -> None:
    """rabbit_reader:handle_frame/4 when closing: other channels' frames and channel 0's
    other methods are dropped, whatever they are."""
    conn = opened()
    conn.receive_data(publish(1)[:20])  # a publish half read when the broker closes
    assert conn.next_event() is NEED_DATA
    conn.send(0, commands.Connection.Close(320, "CONNECTION_FORCED - x", 0, 0))
    conn.receive_data(
        publish(1)[20:]
        + method(1, commands.Channel.Close(200, "bye", 0, 0))
        + method(7, commands.Basic.Qos())  # a channel never opened
        + frame(9, 1, b"junk")  # an unknown frame type
        + frame(8, 0, b"")
        + method(0, commands.Connection.UpdateSecret())
        + method(0, commands.Connection.Close(200, "bye", 0, 0))
    )
    ((channel, close),) = events(conn)  # type: ignore[misc]
    assert channel == 0 and isinstance(close, commands.Connection.Close)
    conn.send(0, commands.Connection.CloseOk())  # the closes crossed
    conn.receive_data(method(0, commands.Connection.CloseOk()))
    ((_, ok),) = events(conn)  # type: ignore[misc]
    assert isinstance(ok, commands.Connection.CloseOk)
    assert conn.state is ConnectionState.CLOSING  # until the transport goes


def test_the_clients_connection_close_is_answered_and_may_come_again() -> None:
    conn = opened()
    conn.receive_data(method(0, commands.Connection.Close(200, "bye", 0, 0)) + publish(1))
    ((_, close),) = events(conn)  # type: ignore[misc]
    assert isinstance(close, commands.Connection.Close)
    assert conn.state is ConnectionState.CLOSING
    _refused(conn, 1, commands.Basic.QosOk())
    conn.send(0, commands.Connection.CloseOk())
    # a client closing from two threads: the second close is answered too
    conn.receive_data(method(0, commands.Connection.Close(200, "bye", 0, 0)))
    assert len(events(conn)) == 1
    conn.send(0, commands.Connection.CloseOk())


def test_after_an_abort_nothing_is_read() -> None:
    conn = _tuning()
    conn.abort()  # an error before tuning: the socket just closes
    assert conn.state is ConnectionState.CLOSING
    conn.receive_data(method(0, commands.Connection.TuneOk(2047, 131072, 0)))
    assert conn.next_event() is NEED_DATA and conn.buffered == 0


def test_once_the_transport_is_gone_nothing_is_read_or_sent() -> None:
    conn = opened()
    conn.connection_lost()
    assert conn.state is ConnectionState.CLOSED and not conn.channels
    conn.receive_data(publish(1))
    assert conn.next_event() is NEED_DATA and conn.buffered == 0
    _refused(conn, 0, commands.Connection.CloseOk())
    _refused(conn, 1, commands.Basic.QosOk())
