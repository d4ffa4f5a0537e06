"""The management API's routes, gathered from one module per resource family."""

from __future__ import annotations

from collections.abc import Callable, Iterable

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
from warren.broker.ops.management.app import HttpSite, ManagementApp, Resource, Router
from warren.broker.ops.management.core import Management


def build_router(test_api: bool = False) -> Router:
    """Every resource family's routes, in this order (a path matched by two patterns with as
    many literal segments goes to the one declared first)."""
    families: list[Iterable[Resource]] = [
        overview.ROUTES,
        access.ROUTES,
        exchanges.ROUTES,
        queues.ROUTES,
        queue_actions.ROUTES,
        queue_messages.ROUTES,
        bindings.ROUTES,
        connections.ROUTES,
        policies.ROUTES,
        parameters.ROUTES,
        global_parameters.ROUTES,
        limits.ROUTES,
        user_limits.ROUTES,
        operator_policies.ROUTES,
        topic_permissions.ROUTES,
        plugins.ROUTES,
        health.ROUTES,
        diagnostics.ROUTES,
        definitions.ROUTES,
        trace.ROUTES,
    ]
    if test_api:  # warren.test_api: without it these paths do not exist (404)
        from warren.broker.ops.management import testapi

        families.append(testapi.ROUTES)
    return Router(*families)


def management_app(mgmt: Management, admit: Callable[[], bool] | None = None) -> HttpSite:
    return HttpSite(ManagementApp(mgmt, build_router(mgmt.broker.settings.test_api)).app, admit)
