"""AMQP exceptions: raised anywhere, turned into channel.close or connection.close in one place.

Each carries the reply code, the full reply text (``NAME - detail``, as
RabbitMQ words it) and the class/method ids of the method that caused it.
"""

from __future__ import annotations

from typing import Final

from warren.protocol.constants import REPLY_NAMES

# Short strings from clients need not be UTF-8: they are decoded and encoded with this
# error handler, so that a name comes back to the client octet for octet.
SURROGATES: Final = "surrogateescape"


class AMQPError(Exception):
    """A protocol exception; the subclass says whether it closes the channel or the connection."""

    def __init__(self, code: int, detail: str, class_id: int = 0, method_id: int = 0) -> None:
        self.code = code
        self.text = f"{REPLY_NAMES.get(code, 'ERROR')} - {detail}"
        self.class_id = class_id
        self.method_id = method_id
        self.channel = 0  # set by the framing layer, which knows the channel but not its owner
        super().__init__(self.text)

    def at(self, class_id: int, method_id: int) -> AMQPError:
        """Name the method that failed, unless a more precise one was set where it was raised."""
        if not self.class_id:
            self.class_id, self.method_id = class_id, method_id
        return self


class ChannelError(AMQPError):
    """Closes the channel (soft error)."""


class ConnectionError_(AMQPError):  # the underscore avoids shadowing the builtin
    """Closes the whole connection (hard error)."""


class LocalProtocolError(Exception):
    """The broker asked to send what the protocol state forbids: a bug on our side, not the
    client's (h11's LocalProtocolError). Nothing was sent; the connection closes with 541."""


def erlang_binary(data: bytes) -> str:
    """Octets as RabbitMQ prints them in its reply texts: ``<<"abc">>`` or ``<<0,20,0,10>>``."""
    if not data:
        return "<<>>"
    if all(32 <= b < 127 for b in data):
        text = data.decode("ascii").replace("\\", "\\\\").replace('"', '\\"')
        return f'<<"{text}">>'
    return "<<" + ",".join(str(b) for b in data) + ">>"


def truncate_reply_text(text: str) -> str:
    """A reply text as it goes out: a short string, and valid UTF-8.

    RabbitMQ cuts texts longer than 255 octets to 252 and '...'. A name in the
    text that was not UTF-8 (read with surrogateescape) shows U+FFFD where its
    bad octets were: a client must be able to decode the reply that tells it so.
    """
    if not text.isascii():
        text = text.encode("utf-8", SURROGATES).decode("utf-8", "replace")
    raw = text.encode()
    if len(raw) <= 255:
        return text
    return raw[:252].decode("utf-8", "ignore") + "..."
