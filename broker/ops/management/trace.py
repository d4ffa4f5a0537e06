"""/api/trace: Warren's message-lifecycle tracing (broker/tracing/tracer.py), on and off per vhost.

``GET /api/trace`` says which vhosts trace, where the files are and how many events were
dropped so far; ``PUT /api/trace/{vhost}`` starts tracing a vhost (201, or 204 if it
already traced) and ``DELETE`` stops it. Administrators only, as RabbitMQ's trace_on.
"""

from __future__ import annotations

from aiohttp import web

from warren.broker.ops.management import auth
from warren.broker.ops.management.app import Ctx, Resource, created, no_content, reply


def trace_status(ctx: Ctx) -> web.StreamResponse:
    return reply(ctx, ctx.mgmt.broker.tracing.status())


def trace_on(ctx: Ctx) -> web.StreamResponse:
    return created() if ctx.mgmt.broker.tracing.enable(ctx.vhost()) else no_content()


def trace_off(ctx: Ctx) -> web.StreamResponse:
    ctx.mgmt.broker.tracing.disable(ctx.vhost())
    return no_content()


ROUTES = (
    Resource("trace", check=auth.admin, GET=trace_status),
    Resource("trace/{vhost}", check=auth.admin, PUT=trace_on, DELETE=trace_off),
)
