"""Operator policies: policies an operator sets over the users' own, on a few numeric keys.

RabbitMQ 4.3 keeps them as the runtime parameter ``operator_policy``/<name>, valued
``{"pattern", "definition", "priority", "apply-to"}`` (rabbit_policy:set_op/7), so they are
listed under /api/parameters and travel in definitions as parameters. At most one applies to
a queue (the highest priority, as for policies), and its definition is merged with the
queue's policy key by key (rabbit_policy:merge_operator_definitions/2):
- a key in one of them only: that value;
- in both: rabbit_policies:merge_policy_value/3 and rabbit_quorum_queue's: the smaller for
  ``expires``, ``message-ttl``, ``max-length``, ``max-length-bytes``, ``max-in-memory-*``,
  ``delayed-retry-max`` and ``delivery-limit`` (for the latter the larger when either is
  negative, i.e. unlimited); the larger for ``delayed-retry-min`` and ``target-group-size``;
  the operator's for ``overflow``, ``queue-version`` and ``delayed-retry-type``.
Only the keys RabbitMQ registers as operator_policy_validator are accepted, with its texts.
``queue-version``, ``max-in-memory-*`` and ``target-group-size`` are accepted and stored and
have no effect on Warren (as the first two have none on RabbitMQ 4).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from warren.broker.engine.deprecated import erlang_term
from warren.broker.engine.parameters import ParameterError
from warren.broker.engine.policy import APPLY_TO, Policy

if TYPE_CHECKING:
    from warren.broker.engine.vhost import VirtualHost

COMPONENT = "operator_policy"


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check(test: Callable[[Any], bool], what: str) -> Callable[[Any], str | None]:
    return lambda value: None if test(value) else f"{erlang_term(value)} is not a valid {what}"


# rabbit_policies:validate_policy0/2 and rabbit_quorum_queue:validate_policy0/2 (4.3)
VALIDATORS: dict[str, Callable[[Any], str | None]] = {
    "expires": _check(lambda v: _int(v) and v >= 1, "queue expiry"),
    "message-ttl": _check(lambda v: _int(v) and v >= 0, "message TTL"),
    "max-length": _check(lambda v: _int(v) and v >= 0, "maximum length"),
    "max-length-bytes": _check(lambda v: _int(v) and v >= 0, "maximum length in bytes"),
    "max-in-memory-length": _check(lambda v: _int(v) and v >= 0, "maximum memory in bytes"),
    "max-in-memory-bytes": _check(lambda v: _int(v) and v >= 0, "maximum memory in bytes"),
    "delivery-limit": _check(_int, "delivery limit"),
    "queue-version": _check(lambda v: _int(v) and v in (1, 2), "queue-version value"),
    "overflow": _check(
        lambda v: v in ("drop-head", "reject-publish", "reject-publish-dlx"), "overflow value"
    ),
    "target-group-size": _check(lambda v: _int(v) and v > 0, "qq target count value"),
    "delayed-retry-type": lambda v: (
        None
        if v in ("all", "failed", "returned", "disabled")
        else f"{erlang_term(v)} is not a valid delayed retry type. "
        "Must be one of: all, failed, returned, disabled"
    ),
    "delayed-retry-min": lambda v: (
        None
        if _int(v) and v > 0
        else f"{erlang_term(v)} is not a valid delayed retry minimum delay. "
        "Must be a positive integer"
    ),
    "delayed-retry-max": lambda v: (
        None
        if _int(v) and v > 0
        else f"{erlang_term(v)} is not a valid delayed retry maximum delay. "
        "Must be a positive integer"
    ),
}

_SMALLER = {
    "expires", "message-ttl", "max-length", "max-length-bytes", "max-in-memory-length",
    "max-in-memory-bytes", "delayed-retry-max",
}  # fmt: skip
_LARGER = {"delayed-retry-min", "target-group-size"}


def merge_value(key: str, value: Any, op_value: Any) -> Any:
    """rabbit_policy:merge_policy_value/3 for a key both definitions have."""
    if key in _SMALLER and _int(value) and _int(op_value):
        return min(value, op_value)
    if key in _LARGER and _int(value) and _int(op_value):
        return max(value, op_value)
    if key == "delivery-limit" and _int(value) and _int(op_value):
        return max(value, op_value) if min(value, op_value) < 0 else min(value, op_value)
    return op_value  # overflow, queue-version, delayed-retry-type, booleans: the operator's


def merge(policy: Policy | None, operator: Policy | None) -> dict[str, Any]:
    """A queue's effective definition (rabbit_policy:merge_operator_definitions/2)."""
    if operator is None:
        return policy.definition if policy is not None else {}
    if policy is None:
        return operator.definition
    out = dict(policy.definition)
    for key, op_value in operator.definition.items():
        out[key] = merge_value(key, out[key], op_value) if key in out else op_value
    return out


def validate_definition(definition: Any) -> None:
    """rabbit_policy:validation/3 with the operator_policy_validator keys; RabbitMQ's texts."""
    if definition in ({}, []):
        raise ParameterError("no policy provided")
    if not isinstance(definition, dict):
        raise ParameterError(f"definition must be a dictionary: {erlang_term(definition)}")
    unknown = [(k, v) for k, v in definition.items() if k not in VALIDATORS]
    for key, value in definition.items():
        if key in VALIDATORS and (error := VALIDATORS[key](value)) is not None:
            raise ParameterError(error)
    if unknown:
        terms = ",".join(f"{{{erlang_term(k)},{erlang_term(v)}}}" for k, v in unknown)
        raise ParameterError(f"[{terms}] are not recognised policy settings")


@dataclass
class OperatorPolicy(Policy):
    """A Policy whose definition is checked against the operator keys only."""

    def __post_init__(self) -> None:
        if self.apply_to not in APPLY_TO:
            raise ParameterError(
                f"apply-to '{self.apply_to}' unrecognised; should be one of: 'queues', "
                "'classic_queues',  'quorum_queues', 'streams', 'exchanges', or 'all'"
            )
        try:
            self.regex = re.compile(self.pattern)
        except re.error as exc:
            raise ParameterError(
                f"pattern should be regular expression but is invalid: {exc}"
            ) from None
        validate_definition(self.definition)


def from_value(vhost: str, name: str, value: Any) -> OperatorPolicy:
    """The policy a parameter value holds; ParameterError with rabbit_parameter_validation's
    texts (priority, pattern, apply-to, definition: its order of constraints)."""
    if not isinstance(value, dict):
        raise ParameterError(f"{name} not a list {erlang_term(value)}")
    missing = [k for k in ("priority", "pattern", "definition") if k not in value]
    if missing:
        raise ParameterError(f'Key "{missing[0]}" not found in {name}')
    priority = value["priority"]
    if not _int(priority) and not isinstance(priority, float):
        raise ParameterError(f"priority should be a number, actually was {erlang_term(priority)}")
    pattern = value["pattern"]
    if not isinstance(pattern, str):
        raise ParameterError(f"pattern should be a binary but was {erlang_term(pattern)}")
    apply_to = value.get("apply-to", "all")
    if not isinstance(apply_to, str):
        apply_to = erlang_term(apply_to)
    return OperatorPolicy(vhost, name, pattern, value["definition"], apply_to, int(priority))


class OperatorPolicies:
    """The ``operator_policy`` component: a value set is a vhost's operator policy."""

    name = COMPONENT

    def __init__(self, vhosts: dict[str, VirtualHost]) -> None:
        self.vhosts = vhosts

    def validate(self, vhost: str, name: str, value: Any) -> None:
        from_value(vhost, name, value)

    def on_set(self, vhost: str, name: str, value: Any) -> None:
        target = self.vhosts.get(vhost)
        if target is not None:
            target.set_operator_policy(from_value(vhost, name, value))

    def on_clear(self, vhost: str, name: str) -> None:
        target = self.vhosts.get(vhost)
        if target is not None:
            target.clear_operator_policy(name)
