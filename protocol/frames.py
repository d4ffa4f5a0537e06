"""Frame encoding: method, content header, body and heartbeat frames."""

from __future__ import annotations

from struct import Struct
from typing import Final

from warren.protocol.constants import FRAME_BODY, FRAME_HEADER

frame_head: Final = Struct(">BHI")
_content_head: Final = Struct(">BHIHHQ")  # frame head + class, weight, body size

HEARTBEAT_FRAME: Final = b"\x08\x00\x00\x00\x00\x00\x00\xce"


def content_frames(channel: int, properties: bytes, body: bytes, frame_max: int) -> list[bytes]:
    """The content header frame and the body frames of one message, split at ``frame_max``."""
    size = len(body)
    out = [
        _content_head.pack(FRAME_HEADER, channel, 12 + len(properties), 60, 0, size),
        properties,
        b"\xce",
    ]
    limit = frame_max - 8
    if size <= limit:
        if size:
            out.append(frame_head.pack(FRAME_BODY, channel, size))
            out.append(body)
            out.append(b"\xce")
        return out
    out.extend(body_frames(channel, body, frame_max))
    return out


def body_frames(channel: int, body: bytes, frame_max: int) -> list[bytes]:
    """A body too large for one frame, split at ``frame_max``."""
    out = []
    view = memoryview(body)
    for start in range(0, len(body), frame_max - 8):
        chunk = view[start : start + frame_max - 8]
        out.append(frame_head.pack(FRAME_BODY, channel, len(chunk)))
        out.append(chunk.tobytes())
        out.append(b"\xce")
    return out
