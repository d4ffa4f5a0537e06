"""AMQP 0-9-1 without I/O: frames and field tables in, methods and events out.

Nothing here imports asyncio or touches a socket; feed it bytes with
``ProtocolConnection.receive_data`` and read events with ``next_event``.
"""

from warren.protocol.connection import (
    NEED_DATA,
    ChannelState,
    ConnectionState,
    Content,
    ProtocolConnection,
    Sentinel,
)
from warren.protocol.errors import AMQPError, ChannelError, ConnectionError_, LocalProtocolError

__all__ = [
    "NEED_DATA",
    "AMQPError",
    "ChannelError",
    "ChannelState",
    "ConnectionError_",
    "ConnectionState",
    "Content",
    "LocalProtocolError",
    "ProtocolConnection",
    "Sentinel",
]
