"""Definitions: the whole topology in RabbitMQ's JSON format, exported and imported.

A RabbitMQ definitions file (users with their salted SHA-256 hashes, vhosts,
permissions, policies, queues, exchanges, bindings) imports as it is, over
``POST /api/definitions`` or at boot from the ``load_definitions`` setting.
Import follows RabbitMQ's order and rules: objects that exist are kept
(not compared), ``amq.*`` names are skipped, a binding whose source or
destination is missing is skipped, anything else invalid stops the import
with a 400 (objects imported before it stay, as in RabbitMQ).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from warren.broker.ops.management import auth, operations
from warren.broker.ops.management.access import (
    permissions,
    put_user,
    put_vhost,
    set_permissions,
    user_json,
)
from warren.broker.ops.management.app import Ctx, Resource, json_response, no_content
from warren.broker.ops.management.errors import ApiError, bad_request, from_operation, not_found
from warren.broker.ops.management.formats import (
    exchange_json,
    json_value,
    table_from_json,
    vhost_bindings,
)
from warren.broker.ops.management.global_parameters import global_parameters, set_global
from warren.broker.ops.management.operator_policies import set_operator_policy
from warren.broker.ops.management.overview import API_VERSION
from warren.broker.ops.management.parameters import parameter_json, set_parameter
from warren.broker.ops.management.policies import set_policy
from warren.broker.ops.management.topic_permissions import (
    set_topic_permission,
    topic_permissions,
)
from warren.config import ConfigError
from warren.protocol.constants import INTERNAL_ERROR
from warren.protocol.errors import AMQPError, ConnectionError_

if TYPE_CHECKING:
    from warren.broker.engine.vhost import VirtualHost
    from warren.broker.ops.management.core import Management


class DefinitionsError(ConfigError):
    """A ``load_definitions`` file Warren refuses to start with."""


# ---- export ----


def _exported_queues(vhost: VirtualHost) -> list[dict[str, Any]]:
    # exclusive queues die with their connection: RabbitMQ leaves them out
    return [
        {
            "name": q.name,
            "vhost": vhost.name,
            "type": q.queue_type,  # rabbit_definitions:queue_definition/1 (4.3)
            "durable": q.durable,
            "auto_delete": q.auto_delete,
            "arguments": json_value(q.arguments),
        }
        for q in vhost.queues.values()
        if q.exclusive_owner is None
    ]


def _exported_exchanges(vhost: VirtualHost) -> list[dict[str, Any]]:
    out = []
    for exchange in vhost.exchanges.values():
        if exchange.name == "" or exchange.name.startswith("amq."):
            continue
        entry = exchange_json(vhost, exchange)
        del entry["user_who_performed_action"]
        entry.pop("messages_delayed", None)  # a count, not a definition
        out.append(entry)
    return out


def _exported_bindings(vhost: VirtualHost) -> list[dict[str, Any]]:
    exported_queues = {q.name for q in vhost.queues.values() if q.exclusive_owner is None}
    out = []
    for b in vhost_bindings(vhost):
        if b["source"] == "":
            continue  # the default exchange's bindings are implicit
        if b["destination_type"] == "queue" and b["destination"] not in exported_queues:
            continue
        del b["properties_key"]
        out.append(b)
    return out


def export(mgmt: Management, only: str | None = None) -> dict[str, Any]:
    broker = mgmt.broker
    names = [only] if only is not None else sorted(broker.vhosts)
    queues: list[dict[str, Any]] = []
    exchanges: list[dict[str, Any]] = []
    bindings: list[dict[str, Any]] = []
    policies: list[dict[str, Any]] = []
    # rabbit_definitions:runtime_parameter_definition/1: value, vhost, component, name
    params = [
        parameter_json(mgmt, key)
        for key in broker.parameters.list()
        if only is None or key[0] == only
    ]
    for name in names:
        vhost = broker.vhosts[name]
        queues += _exported_queues(vhost)
        exchanges += _exported_exchanges(vhost)
        bindings += _exported_bindings(vhost)
        policies += [p.as_json() for p in vhost.policies.values()]
    if only is not None:
        # RabbitMQ 3.10 (checked side by side) keeps the vhost in a vhost export's parameters
        for item in (*queues, *exchanges, *bindings):
            del item["vhost"]
        meta = mgmt.meta(only)
        return {
            "rabbit_version": API_VERSION,
            # rabbit_mgmt_wm_definitions:small_parts/1 ({vhost, _}): the vhost's metadata
            "metadata": {
                "description": meta.description,
                "tags": list(meta.tags),
                "default_queue_type": broker.vhosts[only].default_queue_type,
            },
            "parameters": params,
            "policies": policies,
            "queues": queues,
            "exchanges": exchanges,
            "bindings": bindings,
        }
    vhosts = []
    user_limits = broker.access.user_limits
    for name in names:
        meta = mgmt.meta(name)
        # rabbit_definitions:vhost_definition/1 (4.3): the metadata carries the vhost's
        # default_queue_type, which every 4.3 vhost has
        limits = broker.parameters.get(name, "vhost-limits", "limits")
        entry: dict[str, Any] = {
            "name": name,
            "limits": limits if isinstance(limits, dict) else {},
            "description": meta.description,
            "tags": list(meta.tags),
            "metadata": {
                "description": meta.description,
                "tags": list(meta.tags),
                "default_queue_type": broker.vhosts[name].default_queue_type,
            },
        }
        vhosts.append(entry)
    return {
        "rabbit_version": API_VERSION,
        "rabbitmq_version": API_VERSION,
        "product_name": mgmt.product_name,
        "product_version": mgmt.product_version,
        "users": [user_json(u, user_limits.get(u.name)) for u in broker.access.users.values()],
        "vhosts": vhosts,
        "permissions": permissions(mgmt),
        "topic_permissions": topic_permissions(mgmt),
        "parameters": params,
        "global_parameters": global_parameters(mgmt),
        "policies": policies,
        "queues": queues,
        "exchanges": exchanges,
        "bindings": bindings,
    }


# ---- import ----


def _items(data: dict[str, Any], section: str) -> list[dict[str, Any]]:
    items = data.get(section)
    if items is None:
        return []
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise bad_request(f"'{section}' must be a list of objects")
    return items


def _name(item: dict[str, Any], key: str = "name") -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise bad_request(["missing_name", json_value(item)])
    return value


def _vhost(mgmt: Management, item: dict[str, Any], only: str | None) -> VirtualHost:
    name = only if only is not None else _name(item, "vhost")
    vhost = mgmt.broker.vhosts.get(name)
    if vhost is None:
        raise bad_request(["no_such_vhost", name])
    return vhost


def _import_exchange(mgmt: Management, item: dict[str, Any], only: str | None) -> None:
    vhost = _vhost(mgmt, item, only)
    name = _name(item)
    if name == "" or name.startswith("amq.") or name in vhost.exchanges:
        return  # RabbitMQ skips amq.* and keeps what exists
    operations.declare_exchange(mgmt, vhost, name, item, None)


def _import_queue(mgmt: Management, item: dict[str, Any], only: str | None) -> None:
    vhost = _vhost(mgmt, item, only)
    name = _name(item)
    if name.startswith("amq.") or name in vhost.queues:
        return
    # RabbitMQ 4.3 (rabbit_definitions:add_queue_int/3): durable unless the file says not,
    # and a queue refused as a deprecated feature is skipped (declare's result is ignored)
    try:
        operations.declare_queue(mgmt, vhost, name, {"durable": True, **item}, None)
    except ConnectionError_ as exc:
        if exc.code != INTERNAL_ERROR:
            raise
        mgmt.broker.log.warning("definitions: queue skipped", vhost=vhost.name, queue=name)


def _import_binding(mgmt: Management, item: dict[str, Any], only: str | None) -> None:
    vhost = _vhost(mgmt, item, only)
    source = _name(item, "source")
    dest_name = _name(item, "destination")
    kind = "e" if item.get("destination_type") == "exchange" else "q"
    dest = (vhost.exchanges if kind == "e" else vhost.queues).get(dest_name)
    if source == "" or source not in vhost.exchanges or dest is None:
        mgmt.broker.log.warning(
            "definitions: binding skipped, source or destination missing",
            vhost=vhost.name,
            source=source,
            destination=dest_name,
        )
        return
    routing_key = item.get("routing_key") or ""
    vhost.bind(source, dest, str(routing_key), table_from_json(item.get("arguments")))


def _import_parameter(mgmt: Management, item: dict[str, Any], only: str | None) -> None:
    # rabbit_definitions:add_parameter/2: the file's vhost, component, name and value
    vhost = _vhost(mgmt, item, only)
    component = _name(item, "component")
    name = _name(item)
    if "value" not in item:
        raise bad_request(f"parameter {component}/{vhost.name}/{name} has no value")
    set_parameter(mgmt, vhost.name, component, name, item["value"])


def _import_operator_policy(mgmt: Management, item: dict[str, Any], only: str | None) -> None:
    """An ``operator_policies`` entry (policy-shaped). RabbitMQ itself carries operator
    policies as ``operator_policy`` parameters, which import with the other parameters."""
    vhost = _vhost(mgmt, item, only)
    set_operator_policy(mgmt, vhost.name, _name(item), item)


def _import_vhost(mgmt: Management, item: dict[str, Any], user: str | None) -> None:
    name = _name(item)
    limits = item.get("limits")
    if limits and not isinstance(limits, dict):
        raise bad_request(f"vhost '{name}': limits must be an object")
    put_vhost(mgmt, name, item, user)
    if limits:  # rabbit_definitions:vhost_definition/1 carries them beside the parameter
        set_parameter(mgmt, name, "vhost-limits", "limits", limits)


def _import_global(mgmt: Management, item: dict[str, Any]) -> None:
    # rabbit_definitions:add_global_parameter/2
    name = _name(item)
    if "value" not in item:
        raise bad_request(f"global parameter {name} has no value")
    set_global(mgmt, name, item["value"])


def _import_policy(mgmt: Management, item: dict[str, Any], only: str | None) -> None:
    vhost = _vhost(mgmt, item, only)
    name = _name(item)
    try:
        set_policy(mgmt, vhost.name, name, item)
    except ApiError as exc:
        if isinstance(exc.reason, str):
            exc.reason = f"{exc.reason} ({vhost.name}/{name})"
        raise


def import_definitions(
    mgmt: Management, data: Any, only: str | None = None, user: str | None = None
) -> None:
    """Apply a definitions document; raises ApiError (400) on the first invalid entry.

    ``user`` is who imports over HTTP: it gets full permissions on the vhosts it creates.
    """
    if not isinstance(data, dict):
        raise bad_request("failed_to_parse_json")
    steps: list[tuple[str, Callable[[dict[str, Any]], None]]] = []
    if only is None:
        steps += [
            ("users", lambda i: _ignore(put_user(mgmt, _name(i), i))),
            ("vhosts", lambda i: _import_vhost(mgmt, i, user)),
            ("permissions", lambda i: set_permissions(mgmt, i.get("user"), i.get("vhost"), i)),
            ("global_parameters", lambda i: _import_global(mgmt, i)),
        ]
    steps += [
        ("parameters", lambda i: _import_parameter(mgmt, i, only)),
        ("exchanges", lambda i: _import_exchange(mgmt, i, only)),
    ]
    if only is None:  # rabbit_definitions:apply_defs/3: after the exchanges they name
        steps += [
            (
                "topic_permissions",
                lambda i: set_topic_permission(mgmt, i.get("user"), i.get("vhost"), i),
            )
        ]
    steps += [
        ("policies", lambda i: _import_policy(mgmt, i, only)),
        ("operator_policies", lambda i: _import_operator_policy(mgmt, i, only)),
        ("queues", lambda i: _import_queue(mgmt, i, only)),
        ("bindings", lambda i: _import_binding(mgmt, i, only)),
    ]
    for section, apply in steps:
        for item in _items(data, section):
            try:
                apply(item)
            except AMQPError as exc:
                raise bad_request(from_operation(exc).reason) from None


def _ignore(_: object) -> None:
    pass


def load_definitions(mgmt: Management, path: str) -> None:
    """Boot-time import of ``load_definitions``: a file, or every ``*.json`` of a directory."""
    if os.path.isdir(path):
        files = [os.path.join(path, f) for f in sorted(os.listdir(path)) if f.endswith(".json")]
    else:
        files = [path]
    for filename in files:
        try:
            with open(filename, encoding="utf-8") as fh:
                data = json.load(fh)
        except OSError as exc:
            raise DefinitionsError(
                f"load_definitions: cannot read {filename}: {exc.strerror}"
            ) from None
        except ValueError as exc:
            raise DefinitionsError(f"load_definitions: {filename} is not JSON: {exc}") from None
        try:
            import_definitions(mgmt, data)
        except ApiError as exc:
            raise DefinitionsError(
                f"load_definitions: {filename}: {json.dumps(exc.reason)}"
            ) from None
        mgmt.broker.log.info("definitions imported", file=filename)


# ---- HTTP ----


def get_definitions(ctx: Ctx) -> web.StreamResponse:
    only = ctx.params.get("vhost")
    if only is not None and only not in ctx.mgmt.broker.vhosts:
        raise bad_request("vhost_not_found")
    headers = {}
    download = ctx.query("download")
    if download:
        headers["Content-Disposition"] = f"attachment; filename={download}"
    return json_response(export(ctx.mgmt, only), headers=headers)


def post_definitions(ctx: Ctx) -> web.StreamResponse:
    only = ctx.params.get("vhost")
    if only is not None and only not in ctx.mgmt.broker.vhosts:
        raise not_found("vhost_not_found")
    body = ctx.body.strip()
    try:
        data = json.loads(body) if body else {}
    except (ValueError, UnicodeDecodeError):
        raise bad_request("failed_to_parse_json") from None
    import_definitions(ctx.mgmt, data, only, ctx.user.name)
    return no_content()


ROUTES = (
    Resource(
        "definitions",
        "all-configuration",
        "definitions/{vhost}",
        check=auth.admin,
        GET=get_definitions,
        POST=post_definitions,
    ),
)
