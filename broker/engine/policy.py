"""Policies: (pattern, apply-to, priority, definition) per vhost; at most one applies to a queue.

The highest-priority matching policy wins, as in RabbitMQ. Setting or
clearing a policy re-applies the effective one to every queue of the vhost.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from warren.broker.engine.arguments import is_int
from warren.broker.engine.deprecated import HA_KEYS
from warren.broker.engine.retry import RETRY_TYPES, RetryConfigError, parse_schedule

APPLY_TO = ("queues", "classic_queues", "quorum_queues", "streams", "exchanges", "all")

# definition keys Warren understands, with their validators (value -> error text or None)
_POSITIVE_INT_KEYS = ("consumer-timeout", "expires")
_NON_NEGATIVE_INT_KEYS = ("message-ttl", "max-length", "max-length-bytes")
_DEPRECATED_KEYS = ("queue-master-locator", *HA_KEYS)


class PolicyError(ValueError):
    """A policy that cannot be set; the text says why (the HTTP API answers 400 with it)."""


def validate_definition(definition: dict[str, Any]) -> None:
    if not isinstance(definition, dict) or not definition:
        raise PolicyError("a policy definition must be a non-empty JSON object")
    for key, value in definition.items():
        if key in _POSITIVE_INT_KEYS:
            if not is_int(value) or value <= 0:
                raise PolicyError(f"{key} must be a positive integer (milliseconds), got {value!r}")
        elif key in _NON_NEGATIVE_INT_KEYS:
            if not is_int(value) or value < 0:
                raise PolicyError(f"{key} must be a non-negative integer, got {value!r}")
        elif key in ("dead-letter-exchange", "dead-letter-routing-key", "alternate-exchange"):
            if not isinstance(value, str):
                raise PolicyError(f"{key} must be a string, got {value!r}")
        elif key == "overflow":
            if value not in ("drop-head", "reject-publish", "reject-publish-dlx"):
                raise PolicyError(
                    "overflow must be drop-head, reject-publish or reject-publish-dlx"
                )
        elif key in ("delayed-retry-min", "delayed-retry-max"):
            if not is_int(value) or value < 0:
                raise PolicyError(f"{key} must be a non-negative integer (ms), got {value!r}")
        elif key == "delayed-retry-multiplier":
            if not is_int(value) or value < 1:
                raise PolicyError(f"{key} must be a positive integer, got {value!r}")
        elif key == "delayed-retry-type":
            if value not in RETRY_TYPES:
                raise PolicyError(f"{key} must be one of {', '.join(RETRY_TYPES)}, got {value!r}")
        elif key == "delayed-retry-schedule":
            try:
                parse_schedule(value if isinstance(value, str) else "?")
            except RetryConfigError as exc:
                raise PolicyError(f"{key}: {exc}") from None
        elif key in _DEPRECATED_KEYS:
            pass  # accepted only when permitted: DeprecatedFeatures.policy_error checks first
        elif key in _STREAM_KEYS:  # streams (broker/streams/stream.py), rabbit_policies' texts
            _validate_stream_key(key, value)
        elif key == "delivery-limit":
            if not is_int(value) or value < -1:
                raise PolicyError(f"delivery-limit must be an integer >= -1, got {value!r}")
        else:
            raise PolicyError(f"unknown policy key '{key}'")


_STREAM_KEYS = (
    "max-age",
    "stream-max-segment-size-bytes",
    "stream-filter-size-bytes",
    "initial-cluster-size",
)


def _validate_stream_key(key: str, value: Any) -> None:
    from warren.broker.streams.log import MAX_SEGMENT_SIZE
    from warren.broker.streams.stream import parse_age

    if key == "max-age":
        if not isinstance(value, str) or parse_age(value) is None:
            raise PolicyError(f"{value!r} is not a valid max age")
    elif key == "initial-cluster-size":
        if not is_int(value) or value < 0:
            raise PolicyError(f"{value!r} is not a valid cluster size")
    elif key == "stream-max-segment-size-bytes":
        if not is_int(value) or not 0 <= value <= MAX_SEGMENT_SIZE:
            raise PolicyError(f"{value!r} is not a valid segment size")
    elif not is_int(value) or not 16 <= value <= 255:
        raise PolicyError(f"{value!r} is not a valid filter size. Valid range is 16-255")


@dataclass
class Policy:
    vhost: str
    name: str
    pattern: str
    definition: dict[str, Any]
    apply_to: str = "all"
    priority: int = 0
    regex: re.Pattern[str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.apply_to not in APPLY_TO:
            raise PolicyError(
                f"apply-to must be one of {', '.join(APPLY_TO)}, got '{self.apply_to}'"
            )
        if not is_int(self.priority):
            raise PolicyError(f"priority must be an integer, got {self.priority!r}")
        try:
            self.regex = re.compile(self.pattern)
        except re.error as exc:
            raise PolicyError(f"invalid pattern '{self.pattern}': {exc}") from None
        validate_definition(self.definition)

    def applies_to_queue(self, name: str, queue_type: str) -> bool:
        if self.apply_to == "exchanges":
            return False
        if self.apply_to == "classic_queues" and queue_type != "classic":
            return False
        if self.apply_to == "quorum_queues" and queue_type != "quorum":
            return False
        if self.apply_to == "streams" and queue_type != "stream":
            return False
        return self.regex.search(name) is not None

    def applies_to_exchange(self, name: str) -> bool:
        return self.apply_to in ("exchanges", "all") and self.regex.search(name) is not None

    def as_json(self) -> dict[str, Any]:
        return {
            "vhost": self.vhost,
            "name": self.name,
            "pattern": self.pattern,
            "apply-to": self.apply_to,
            "definition": self.definition,
            "priority": self.priority,
        }


def pick(policies: dict[str, Policy], matches: Any) -> Policy | None:
    """The matching policy with the highest priority (ties: the name that sorts last, stable)."""
    best: Policy | None = None
    for policy in policies.values():
        if matches(policy) and (
            best is None or (policy.priority, policy.name) > (best.priority, best.name)
        ):
            best = policy
    return best
