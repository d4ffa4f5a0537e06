"""More of RabbitMQ's health checks (rabbit_mgmt_wm_health_check_*): shapes and codes as
RabbitMQ 3.10.8 answers them side by side, and 4.3's where they changed; a failed check is a
503."""

from __future__ import annotations

import os
import re
import ssl
import tempfile
import time
from typing import Any

from aiohttp import web

from warren.broker.ops.management import auth
from warren.broker.ops.management.app import Ctx, Resource, json_response, reply
from warren.broker.ops.management.errors import bad_request


def virtual_hosts(ctx: Ctx) -> web.StreamResponse:
    return reply(ctx, {"status": "ok"})  # every vhost of a Warren node runs while it does


def single_node(ctx: Ctx) -> web.StreamResponse:
    # rabbit_mgmt_wm_health_check_node_is_quorum_critical: one node is never critical
    return reply(ctx, {"status": "ok", "reason": "single node cluster"})


def port_listener(ctx: Ctx) -> web.StreamResponse:
    mgmt = ctx.mgmt
    try:
        port = int(ctx.params["port"])
    except ValueError:
        raise bad_request(f"Invalid port: {ctx.params['port']}") from None
    ports = [p for _, p in mgmt.listeners]
    ports += [p for p in (mgmt.management_port, mgmt.prometheus_port) if p is not None]
    if port in ports:
        return reply(ctx, {"status": "ok", "port": port})
    return json_response(
        {"status": "failed", "reason": "No active listener", "missing": port, "ports": ports},
        503,
    )


# rabbit_mgmt_wm_health_check_protocol_listener:normalize_protocol/1 (4.3), the names that
# can name a Warren listener
_PROTOCOL_ALIASES = {
    "amqp091": "amqp", "amqp0.9.1": "amqp", "amqp0-9-1": "amqp", "amqp0_9_1": "amqp",
    "amqp10": "amqp", "amqp1.0": "amqp", "amqp1-0": "amqp", "amqp1_0": "amqp",
    "amqps": "amqp/ssl", "http1": "http", "http1.1": "http", "http_api": "http",
    "management": "http", "management_ui": "http", "ui": "http", "prometheus": "http/prometheus",
}  # fmt: skip


def active_protocols(ctx: Ctx) -> list[str]:
    mgmt = ctx.mgmt
    out = []
    if mgmt.listeners:
        out.append("amqp")
    if mgmt.broker.settings.ssl_listeners:
        out.append("amqp/ssl")
    if mgmt.management_port is not None:
        out.append("http")
    if mgmt.prometheus_port is not None:
        out.append("http/prometheus")
    return out


def protocol_listener(ctx: Ctx) -> web.StreamResponse:
    """4.3 takes a comma-separated list and answers the active protocols (3.10: ``protocol``)."""
    wanted = []
    for name in ctx.params["protocols"].split(","):
        name = name.lower()
        if _PROTOCOL_ALIASES.get(name, name) not in wanted:
            wanted.append(_PROTOCOL_ALIASES.get(name, name))
    active = active_protocols(ctx)
    missing = [p for p in wanted if p not in active]
    if not missing:
        return reply(ctx, {"status": "ok", "protocols": active})
    body = {"status": "failed", "reason": "No active listener", "missing": missing}
    return json_response({**body, "protocols": active}, 503)


# rabbit_mgmt_wm_health_check_certificate_expiration's units, in seconds
_UNITS = {"days": 86400, "weeks": 86400 * 7, "months": 86400 * 365 / 12, "years": 86400 * 365}
_PEM = re.compile(r"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", re.DOTALL)


def _not_after(path: str) -> list[float] | str:
    """The expiry of each certificate in a PEM file (seconds), or why it cannot be read."""
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            blocks = _PEM.findall(fh.read())
    except OSError as exc:
        return str(exc.strerror)
    if not blocks:
        return "The certificate file provided does not contain any PEM entry."
    out: list[float] = []
    for block in blocks:
        with tempfile.NamedTemporaryFile("w", suffix=".pem", delete=False) as tmp:
            tmp.write(block + "\n")
        try:  # CPython's own X.509 decoder (the ssl module has no public one)
            decoded: Any = ssl._ssl._test_decode_cert(tmp.name)  # type: ignore[attr-defined]
            out.append(ssl.cert_time_to_seconds(decoded["notAfter"]))
        except (ssl.SSLError, KeyError, ValueError):
            return "The certificate file provided cannot be decoded."
        finally:
            os.unlink(tmp.name)
    return out


def _expiring(path: str | None, deadline: float) -> list[str] | dict[str, str]:
    if path is None:
        return []
    found = _not_after(path)
    if isinstance(found, str):
        return {"error": found}
    stamp = "%Y-%m-%dT%H:%M:%SZ"
    return [time.strftime(stamp, time.gmtime(t)) for t in found if t <= deadline]


def certificate_expiration(ctx: Ctx) -> web.StreamResponse:
    """Certificates of the TLS listeners that expire within the period: 503 naming them."""
    try:
        within = int(ctx.params["within"])
    except ValueError:
        raise bad_request("Invalid expiration value.") from None
    unit = _UNITS.get(ctx.params["unit"].lower())
    if unit is None:
        raise bad_request("Time unit not recognised. Supported units: days, weeks, months, years.")
    deadline = time.time() + within * unit
    settings = ctx.mgmt.broker.settings
    expired = []
    for listener in settings.ssl_listeners:
        certfile = _expiring(settings.ssl_certfile, deadline)
        cacertfile = _expiring(settings.ssl_cacertfile, deadline)
        if certfile or cacertfile:
            expired.append(
                {
                    "node": ctx.mgmt.node,
                    "protocol": "amqp/ssl",
                    "interface": listener.host,
                    "port": listener.port,
                    "certfile": settings.ssl_certfile,
                    "cacertfile": settings.ssl_cacertfile,
                    "certfile_expires_on": certfile,
                    "cacertfile_expires_on": cacertfile,
                }
            )
    if not expired:
        return reply(ctx, {"status": "ok"})
    body = {"status": "failed", "reason": "Certificates expiring", "expired": expired}
    return json_response(body, 503)


ROUTES = (
    Resource("health/checks/virtual-hosts", check=auth.any_user, GET=virtual_hosts),
    Resource(
        "health/checks/node-is-quorum-critical",
        "health/checks/node-is-mirror-sync-critical",
        check=auth.any_user,
        GET=single_node,
    ),
    Resource("health/checks/port-listener/{port}", check=auth.any_user, GET=port_listener),
    Resource(
        "health/checks/protocol-listener/{protocols}", check=auth.any_user, GET=protocol_listener
    ),
    Resource(
        "health/checks/certificate-expiration/{within}/{unit}",
        check=auth.any_user,
        GET=certificate_expiration,
    ),
)
