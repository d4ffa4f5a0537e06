"""Vhost limits as RabbitMQ keeps them: the runtime parameter ``vhost-limits``/``limits``.

The value is an object with ``max-connections`` and ``max-queues`` (a negative number:
no limit); on set it becomes ``VirtualHost.limits``, which the connection open and the
queue declare read (broker/server/handshake.py, broker/engine/vhost.py).
Validation texts follow rabbit_vhost_limit:validate/5 (proplist validation).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from warren.broker.engine.deprecated import erlang_term
from warren.broker.engine.parameters import ParameterError

if TYPE_CHECKING:
    from warren.broker.engine.vhost import VirtualHost

VHOST_LIMITS = ("max-connections", "max-queues")


def is_integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def validate_limits(value: Any, known: tuple[str, ...], where: str = "limits") -> None:
    if not isinstance(value, dict):
        raise ParameterError(f"{where} not a list {erlang_term(value)}")
    unknown = [(k, v) for k, v in value.items() if k not in known]
    if unknown:
        terms = ",".join(f"{{{erlang_term(k)},{erlang_term(v)}}}" for k, v in unknown)
        raise ParameterError(f"Unrecognised terms [{terms}] in {where}")
    for key, limit in value.items():
        if not is_integer(limit):
            raise ParameterError(f"{key} should be a number, actually was {erlang_term(limit)}")


class VhostLimits:
    name = "vhost-limits"

    def __init__(self, vhosts: dict[str, VirtualHost]) -> None:
        self.vhosts = vhosts

    def validate(self, vhost: str, name: str, value: Any) -> None:
        validate_limits(value, VHOST_LIMITS)

    def on_set(self, vhost: str, name: str, value: Any) -> None:
        target = self.vhosts.get(vhost)
        if target is not None:
            target.limits = dict(value)

    def on_clear(self, vhost: str, name: str) -> None:
        target = self.vhosts.get(vhost)
        if target is not None:
            target.limits = {}
