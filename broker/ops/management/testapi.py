"""/api/warren/*: the test kit over HTTP, for test suites in any language (docs/test-kit.md).

Only with ``warren.test_api = true`` (otherwise these paths are 404, as any unknown
path); administrators only. ``POST reset`` empties one vhost or all of them,
``POST clock/advance`` moves the manual clock (``warren.clock = manual``),
``GET published`` and ``GET outcomes/{vhost}/{queue}`` say what happened.
"""

from __future__ import annotations

import datetime
import math
from typing import Any

from aiohttp import web

from warren.broker.engine.timers import ManualTimers, Timers
from warren.broker.ops.management import auth
from warren.broker.ops.management.app import Ctx, Resource, json_response
from warren.broker.ops.management.errors import bad_request, not_found
from warren.broker.testkit.recorder import Recording, recording_of, reset_vhost


def _recording(ctx: Ctx) -> Recording:
    recording = recording_of(ctx.mgmt.broker)
    assert recording is not None  # warren.test_api switches recording on (Management)
    return recording


def reset(ctx: Ctx) -> web.StreamResponse:
    body = ctx.json()
    broker = ctx.mgmt.broker
    vhost = body.get("vhost")
    if vhost is not None and vhost not in broker.vhosts:
        raise not_found("vhost_not_found")
    close = body.get("close_connections", True)
    if not isinstance(close, bool):
        raise bad_request("close_connections: expected true or false")
    names = [vhost] if isinstance(vhost, str) else list(broker.vhosts)
    result = {name: reset_vhost(broker, name, close) for name in names}
    return json_response({"reset": result})


def _time(clock: Timers) -> dict[str, Any]:
    wall = clock.wall()
    return {
        "advanced": clock.advanced if isinstance(clock, ManualTimers) else 0,
        "time": datetime.datetime.fromtimestamp(wall, datetime.UTC).isoformat(),
        "wall": wall,
    }


def clock_status(ctx: Ctx) -> web.StreamResponse:
    clock = ctx.mgmt.broker.clock
    manual = isinstance(clock, ManualTimers)
    return json_response(
        {
            "clock": "manual" if manual else "real",
            **_time(clock),
            "next_due": clock.next_due() if isinstance(clock, ManualTimers) else None,
        }
    )


def clock_advance(ctx: Ctx) -> web.StreamResponse:
    clock = ctx.mgmt.broker.clock
    if not isinstance(clock, ManualTimers):
        raise bad_request("the broker clock is real: set warren.clock = manual to advance it")
    seconds = ctx.json().get("seconds")
    if (
        not isinstance(seconds, int | float)
        or isinstance(seconds, bool)
        or not math.isfinite(seconds)
        or seconds < 0
    ):
        raise bad_request('seconds: expected a number >= 0, e.g. {"seconds": 60}')
    fired = clock.advance(seconds)
    return json_response({"fired": fired, **_time(clock)})


def published(ctx: Ctx) -> web.StreamResponse:
    vhost = ctx.query("vhost")
    if vhost is not None and vhost not in ctx.mgmt.broker.vhosts:
        raise not_found("vhost_not_found")
    exchange, routing_key = ctx.query("exchange"), ctx.query("routing_key")
    items: list[dict[str, Any]] = [
        p.as_json()
        for p in _recording(ctx).published(vhost)
        if (exchange is None or p.exchange == exchange)
        and (routing_key is None or p.routing_key == routing_key)
    ]
    return json_response(items)


def outcomes(ctx: Ctx) -> web.StreamResponse:
    vhost = ctx.vhost().name
    return json_response(
        [o.as_json() for o in _recording(ctx).outcomes(vhost, ctx.params["queue"])]
    )


ROUTES = (
    Resource("warren/reset", check=auth.admin, POST=reset),
    Resource("warren/clock", check=auth.admin, GET=clock_status),
    Resource("warren/clock/advance", check=auth.admin, POST=clock_advance),
    Resource("warren/published", check=auth.admin, GET=published),
    Resource("warren/outcomes/{vhost}/{queue}", check=auth.admin, GET=outcomes),
)
