"""RabbitMQ 4.3's deprecated features: the table, the permits and the refusals.

Facts from rabbitmq-server v4.3.5: every ``-rabbit_deprecated_feature`` attribute
(deps/rabbit/src and deps/rabbitmq_management_agent/src) and the texts that
``rabbit_deprecated_features:generate_warnings1/3`` builds for each phase. A
feature is permitted by its phase's default unless ``deprecated_features.permit.<name>``
says otherwise; ``removed`` features cannot be permitted (RabbitMQ logs that at start),
except that Warren lets ``classic_queue_mirroring = true`` accept ``ha-*`` policy keys as
3.x does (a 3.x user's policies keep working; on one node they change nothing).

Each use of a deprecated feature calls :meth:`DeprecatedFeatures.is_permitted`, which
logs RabbitMQ's text at most once a day per feature (``should_log_warning/1``): a warning
when permitted, an error when denied. No check is on the message path.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from warren.protocol.constants import INTERNAL_ERROR
from warren.protocol.errors import ConnectionError_

PERMITTED_BY_DEFAULT = "permitted_by_default"
DENIED_BY_DEFAULT = "denied_by_default"
REMOVED = "removed"
LOG_INTERVAL = 24 * 60 * 60  # seconds between two log lines for one feature, as RabbitMQ

_BLOG = "https://blog.rabbitmq.com/posts/2021/08/4.0-deprecation-announcements/"


@dataclass(frozen=True)
class Feature:
    name: str
    phase: str
    doc_url: str = ""
    provided_by: str = "rabbit"
    messages: dict[str, str] = field(default_factory=dict)  # overrides of the generated texts

    def text(self, permitted: bool) -> str:
        """The text RabbitMQ logs and puts in its refusals (``get_warning/2``)."""
        if self.phase not in (PERMITTED_BY_DEFAULT, DENIED_BY_DEFAULT):
            if permitted and "when_permitted" in self.messages:  # Warren's 3.x allowance
                return self.messages["when_permitted"]
            return self.messages.get("when_removed") or _removed_text(self.name)
        key = "when_permitted" if permitted else "when_denied"
        return self.messages.get(key) or _generated_text(self.name, self.phase, permitted)


def _generated_text(name: str, phase: str, permitted: bool) -> str:
    permit = f'    "deprecated_features.permit.{name} = '
    future = (
        "Its use will not be permitted by default in a future minor RabbitMQ version and the "
        "feature will be removed from a future major RabbitMQ version; actual versions to be "
        "determined.\n"
    )
    to_continue = (
        "To continue using this feature when it is not permitted by default, set the "
        "following parameter in your configuration:\n"
    )
    head = f"Feature `{name}` is deprecated.\n"
    if phase == PERMITTED_BY_DEFAULT and permitted:
        return (
            f"{head}By default, this feature can still be used for now.\n{future}{to_continue}"
            f'{permit}true"\nTo test RabbitMQ as if the feature was removed, set this in your '
            f'configuration:\n{permit}false"'
        )
    if phase == PERMITTED_BY_DEFAULT:
        return (
            f"{head}Its use is not permitted per the configuration (overriding the default, "
            f'which is permitted):\n{permit}false"\n{future}{to_continue}{permit}true"'
        )
    if permitted:
        return (
            f"{head}Its use is permitted per the configuration (overriding the default, which "
            f'is not permitted):\n{permit}true"\nThe feature will be removed from a future '
            "major RabbitMQ version, regardless of the configuration."
        )
    return (
        f"{head}By default, this feature is not permitted anymore.\nThe feature will be "
        "removed from a future major RabbitMQ version, regardless of the configuration; "
        f'actual version to be determined.\n{to_continue}{permit}true"'
    )


def _removed_text(name: str) -> str:
    return (
        f"Feature `{name}` is removed; its use is not possible anymore.\nIf RabbitMQ refuses "
        "to start because of this, you need to downgrade RabbitMQ and make sure the feature "
        "is not used at all before upgrading again."
    )


_CMQ = '    "deprecated_features.permit.classic_queue_mirroring = {}"'
# rabbit_mirror_queue_misc.erl (v4.3.5) keeps its 3.13 texts
_CMQ_PERMITTED = (
    "Classic mirrored queues are deprecated.\nBy default, they can still be used for now.\n"
    "Their use will not be permitted by default in the next minorRabbitMQ version (if any) "
    "and they will be removed from RabbitMQ 4.0.0.\nTo continue using classic mirrored queues "
    "when they are not permitted by default, set the following parameter in your "
    f"configuration:\n{_CMQ.format('true')}\nTo test RabbitMQ as if they were removed, set this "
    f"in your configuration:\n{_CMQ.format('false')}"
)

FEATURES: dict[str, Feature] = {
    f.name: f
    for f in (
        # AMQP 1.0 only: listed as RabbitMQ lists them, unreachable over AMQP 0-9-1
        Feature(
            "amqp_address_v1",
            DENIED_BY_DEFAULT,
            "https://www.rabbitmq.com/docs/amqp#addresses",
            messages={
                "when_permitted": "RabbitMQ AMQP address version 1 is deprecated. Clients "
                "should use RabbitMQ AMQP address version 2.",
                "when_denied": "RabbitMQ AMQP address version 1 is unsupported. Clients must "
                "use RabbitMQ AMQP address version 2.",
            },
        ),
        Feature(
            "amqp_filter_set_bug",
            DENIED_BY_DEFAULT,
            "https://docs.oasis-open.org/amqp/core/v1.0/os/amqp-core-messaging-v1.0-os.html"
            "#type-filter-set",
        ),
        Feature(
            "classic_queue_mirroring",
            REMOVED,
            f"{_BLOG}#removal-of-classic-queue-mirroring",
            messages={
                "when_permitted": _CMQ_PERMITTED,
                "when_removed": "Classic mirrored queues have been removed.\n",
            },
        ),
        Feature("global_qos", DENIED_BY_DEFAULT, f"{_BLOG}#removal-of-global-qos"),
        Feature(
            "management_metrics_collection",
            PERMITTED_BY_DEFAULT,
            f"{_BLOG}#disable-metrics-delivery-via-the-management-api--ui",
            provided_by="rabbitmq_management_agent",
        ),
        Feature(
            "queue_master_locator",
            DENIED_BY_DEFAULT,
            messages={
                "when_permitted": "queue-master-locator is deprecated. queue-leader-locator "
                "should be used instead (allowed values are 'client-local' and 'balanced')"
            },
        ),
        Feature("ram_node_type", REMOVED, f"{_BLOG}#removal-of-ram-nodes"),
        Feature(
            "transient_nonexcl_queues",
            DENIED_BY_DEFAULT,
            f"{_BLOG}#removal-of-transient-non-exclusive-queues",
        ),
    )
}

# queue-leader-locator values; the last three are the deprecated names (rabbit_queue_location)
LOCATORS = ("client-local", "balanced", "random", "least-leaders", "min-masters")
HA_KEYS = (
    "ha-mode",
    "ha-params",
    "ha-sync-mode",
    "ha-sync-batch-size",
    "ha-promote-on-shutdown",
    "ha-promote-on-failure",
)


class DeprecatedFeatures:
    """The permits of one broker, from ``Settings.deprecated_features_permit``."""

    def __init__(self, permits: tuple[tuple[str, bool], ...], log: Any) -> None:
        self.log = log
        self.config: dict[str, bool] = dict(permits)
        self.permitted: dict[str, bool] = {}
        self._logged: dict[str, float] = {}
        for name, feature in FEATURES.items():
            given = self.config.get(name)
            if feature.phase == PERMITTED_BY_DEFAULT:
                self.permitted[name] = given is not False
            elif feature.phase == DENIED_BY_DEFAULT:
                self.permitted[name] = given is True
            else:
                # rabbit_deprecated_features:should_be_permitted/2; Warren's 3.x allowance
                self.permitted[name] = name == "classic_queue_mirroring" and given is True
                if given is True:
                    log.warning(
                        f"Deprecated features: `{name}`: {feature.phase} feature, it "
                        "cannot be permitted from configuration"
                        + ("; Warren accepts ha-* policy keys" if self.permitted[name] else "")
                    )
        for name in self.config:
            if name not in FEATURES:
                log.warning("deprecated_features.permit: no such deprecated feature", name=name)

    def is_permitted(self, name: str) -> bool:
        """Whether a use may go on; logs as RabbitMQ does, at most once a day per feature."""
        permitted = self.permitted[name]
        now = time.monotonic()
        last = self._logged.get(name)
        if last is None or now - last >= LOG_INTERVAL:
            self._logged[name] = now
            text = f"Deprecated features: `{name}`: {self.text(name)}"
            (self.log.warning if permitted else self.log.error)(text)
        return permitted

    def text(self, name: str) -> str:
        return FEATURES[name].text(self.permitted[name])

    def refusal(self, name: str) -> ConnectionError_:
        # {protocol_error, internal_error, "~ts", [Warning]}: a hard error, connection.close
        # 541 at queue.declare; the 255-octet reply text cuts the warning (the log has it all)
        return ConnectionError_(INTERNAL_ERROR, self.text(name), 50, 10)

    def check_transient_queue(self, durable: bool, exclusive: bool) -> None:
        """A queue about to be created (rabbit_amqqueue:declare/7,
        is_queue_args_combination_permitted/1: after the argument checks, before the vhost's
        queue limit)."""
        if not durable and not exclusive and not self.is_permitted("transient_nonexcl_queues"):
            raise self.refusal("transient_nonexcl_queues")

    def check_master_locator(self, arguments: dict[str, Any]) -> None:
        """A classic queue about to be created (rabbit_classic_queue:declare/2, after
        rabbit_queue_type:declare/2's queue limits)."""
        locator = "x-queue-master-locator" in arguments
        if locator and arguments.get("x-queue-type") in (None, "classic"):  # noqa: SIM102
            if not self.is_permitted("queue_master_locator"):  # logs only when used
                raise self.refusal("queue_master_locator")

    def policy_error(self, definition: dict[str, Any]) -> str | None:
        """RabbitMQ 4.3's refusal of a policy using a deprecated key, or None."""
        if "queue-master-locator" in definition:
            # rabbit_classic_queue:validate_policy/1
            if not self.is_permitted("queue_master_locator"):
                return "use of deprecated queue-master-locator argument is not permitted"
            locator = definition["queue-master-locator"]
            if locator not in LOCATORS:
                return f"{erlang_term(locator)} is not a valid master locator"
        ha = [(k, v) for k, v in definition.items() if k in HA_KEYS]
        if ha and not self.is_permitted("classic_queue_mirroring"):
            # 4.x registers no validator for ha-*: rabbit_policy:validation0/2 lists them
            terms = ",".join(f"{{{erlang_term(k)},{erlang_term(v)}}}" for k, v in ha)
            return f"[{terms}] are not recognised policy settings"
        return None

    def used(self, queues: Any) -> list[str]:
        """Features in use (rabbit_amqqueue:are_transient_nonexcl_used/1 is the only 0-9-1
        callback that can say yes; classic_queue_mirroring's always says no)."""
        for queue in queues:
            if not queue.durable and queue.exclusive_owner is None:
                return ["transient_nonexcl_queues"]
        return []

    def listing(self, used: list[str] | None = None) -> list[dict[str, Any]]:
        """``rabbit_depr_ff_extra:cli_info/1``: sorted by name; ``state`` only in the full list."""
        rows = []
        for name in sorted(FEATURES if used is None else used):
            feature = FEATURES[name]
            row: dict[str, Any] = {
                "name": name,
                "desc": "",
                "deprecation_phase": feature.phase,
                "doc_url": feature.doc_url,
                "provided_by": feature.provided_by,
            }
            if used is None:
                row["state"] = "permitted" if self.permitted[name] else "denied"
            rows.append(row)
        return rows


def erlang_term(value: Any) -> str:
    """A JSON value as RabbitMQ's ``~tp`` prints it after decoding (strings are binaries)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        escaped = value.replace("\\", "\\\\").replace('"', '\\"')
        return f'<<"{escaped}">>' if value.isascii() else f'<<"{escaped}"/utf8>>'
    if isinstance(value, list):
        return "[" + ",".join(erlang_term(v) for v in value) + "]"
    if isinstance(value, dict):
        pairs = (f"{erlang_term(k)} => {erlang_term(v)}" for k, v in value.items())
        return "#{" + ",".join(pairs) + "}"
    if value is None:
        return "null"
    return str(value)
