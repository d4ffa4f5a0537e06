"""AMQP 0-9-1 numbers: frame types, reply codes, class and method ids."""

from __future__ import annotations

from typing import Final

PROTOCOL_HEADER: Final = b"AMQP\x00\x00\x09\x01"

FRAME_METHOD: Final = 1
FRAME_HEADER: Final = 2
FRAME_BODY: Final = 3
FRAME_HEARTBEAT: Final = 8
FRAME_END: Final = 0xCE
FRAME_END_BYTE: Final = b"\xce"
# The smallest frame_max a client may negotiate: 8192 since RabbitMQ 4.1
# (?FRAME_MIN_SIZE in rabbit_common/include/rabbit_framing.hrl; 4096 before)
FRAME_MIN_SIZE: Final = 8192
CHANNEL_MIN: Final = 1  # ?CHANNEL_MIN in rabbit_reader.erl

# reply codes
REPLY_SUCCESS: Final = 200
CONTENT_TOO_LARGE: Final = 311
NO_ROUTE: Final = 312
NO_CONSUMERS: Final = 313
CONNECTION_FORCED: Final = 320
INVALID_PATH: Final = 402
ACCESS_REFUSED: Final = 403
NOT_FOUND: Final = 404
RESOURCE_LOCKED: Final = 405
PRECONDITION_FAILED: Final = 406
FRAME_ERROR: Final = 501
SYNTAX_ERROR: Final = 502
COMMAND_INVALID: Final = 503
CHANNEL_ERROR: Final = 504
UNEXPECTED_FRAME: Final = 505
RESOURCE_ERROR: Final = 506
NOT_ALLOWED: Final = 530
NOT_IMPLEMENTED: Final = 540
INTERNAL_ERROR: Final = 541

REPLY_NAMES: Final = {
    200: "REPLY_SUCCESS",
    311: "CONTENT_TOO_LARGE",
    312: "NO_ROUTE",
    313: "NO_CONSUMERS",
    320: "CONNECTION_FORCED",
    402: "INVALID_PATH",
    403: "ACCESS_REFUSED",
    404: "NOT_FOUND",
    405: "RESOURCE_LOCKED",
    406: "PRECONDITION_FAILED",
    501: "FRAME_ERROR",
    502: "SYNTAX_ERROR",
    503: "COMMAND_INVALID",
    504: "CHANNEL_ERROR",
    505: "UNEXPECTED_FRAME",
    506: "RESOURCE_ERROR",
    530: "NOT_ALLOWED",
    540: "NOT_IMPLEMENTED",
    541: "INTERNAL_ERROR",
}

# class ids
CONNECTION: Final = 10
CHANNEL: Final = 20
EXCHANGE: Final = 40
QUEUE: Final = 50
BASIC: Final = 60
CONFIRM: Final = 85
TX: Final = 90

# (class, method) of the hot methods, decoded by hand
BASIC_QOS: Final = (60, 10)
BASIC_CONSUME: Final = (60, 20)
BASIC_CANCEL: Final = (60, 30)
BASIC_PUBLISH: Final = (60, 40)
BASIC_RETURN: Final = (60, 50)
BASIC_DELIVER: Final = (60, 60)
BASIC_GET: Final = (60, 70)
BASIC_ACK: Final = (60, 80)
BASIC_REJECT: Final = (60, 90)
BASIC_NACK: Final = (60, 120)
