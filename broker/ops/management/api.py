"""The management API's routes, gathered from one module per resource family."""

from __future__ import annotations

from collections.abc import Callable

from warren.broker.ops.management import (
    access,
    bindings,
    connections,
    definitions,
    diagnostics,
    exchanges,
    global_parameters,
    health,
    limits,
    operator_policies,
    overview,
    parameters,
    plugins,
    policies,
    queue_actions,
    queue_messages,
    queues,
    topic_permissions,
    trace,
    user_limits,
)
from warren.broker.ops.management.app import HttpSite, ManagementApp, Router
from warren.broker.ops.management.core import Management


def build_router(test_api: bool = False) -> Router:
    router = Router()
    for module in (
        overview,
        access,
        exchanges,
        queues,
        queue_actions,
        queue_messages,
        bindings,
        connections,
        policies,
        parameters,
        global_parameters,
        limits,
        user_limits,
        operator_policies,
        topic_permissions,
        plugins,
        health,
        diagnostics,
        definitions,
        trace,
    ):
        module.routes(router)
    if test_api:  # warren.test_api: without it these paths do not exist (404)
        from warren.broker.ops.management import testapi

        testapi.routes(router)
    return router


def management_app(mgmt: Management, admit: Callable[[], bool] | None = None) -> HttpSite:
    return HttpSite(ManagementApp(mgmt, build_router(mgmt.broker.settings.test_api)).app, admit)
