"""POST /api/queues/{vhost}/{queue}/actions: administrators only.

RabbitMQ 4.3 (rabbit_mgmt_wm_queue_actions): the body needs ``action``; classic queue
mirroring is gone, so every action, ``sync`` and ``cancel_sync`` included, is a 400
``["unknown", action]`` (3.x answered 204 to those two). A missing queue is a 404
``queue_not_found`` (``vhost_not_found`` for a missing vhost), checked before the body.
"""

from __future__ import annotations

from aiohttp import web

from warren.broker.ops.management import auth
from warren.broker.ops.management.app import Ctx, Resource
from warren.broker.ops.management.errors import bad_request, not_found


def queue_action(ctx: Ctx) -> web.StreamResponse:
    vhost = ctx.mgmt.broker.vhosts.get(ctx.params["vhost"])
    if vhost is None:
        raise not_found("vhost_not_found")
    if ctx.params["queue"] not in vhost.queues:
        raise not_found("queue_not_found")
    (action,) = Ctx.require(ctx.json(), "action")
    raise bad_request(["unknown", action])


ROUTES = (Resource("queues/{vhost}/{queue}/actions", check=auth.admin, POST=queue_action),)
