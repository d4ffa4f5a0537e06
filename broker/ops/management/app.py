"""The management HTTP API: aiohttp's server on the broker's own loop, RabbitMQ's routes.

Routing is done here rather than by aiohttp's router because RabbitMQ's paths
carry names with an encoded slash (the default vhost is ``%2F``): the raw path
is split on ``/`` first and each segment decoded after, which a router matching
decoded paths cannot do. Order of checks follows RabbitMQ (cowboy_rest): unknown
path 404, then method 405, then authentication and tags 401, then the handler.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from aiohttp import web

from warren.broker.ops import console
from warren.broker.ops.management import auth
from warren.broker.ops.management.errors import (
    ApiError,
    bad_request,
    from_operation,
    method_not_allowed,
    not_found,
)
from warren.broker.server.listen import listen_sockets
from warren.protocol.errors import AMQPError

if TYPE_CHECKING:
    from warren.broker.engine.users import User
    from warren.broker.engine.vhost import VirtualHost
    from warren.broker.ops.management.core import Management

MAX_BODY = 20 * 1024 * 1024  # RabbitMQ's management.http.max_body_size default (definitions)

Handler = Callable[["Ctx"], web.StreamResponse]


class Ctx:
    """One API request: its path parameters, body and authenticated user."""

    def __init__(
        self,
        mgmt: Management,
        request: web.Request,
        method: str,
        params: dict[str, str],
        user: User,
    ) -> None:
        self.mgmt = mgmt
        self.request = request
        self.method = method
        self.params = params
        self.user = user
        self.body = b""

    def query(self, name: str) -> str | None:
        return self.request.query.get(name)

    def json(self) -> dict[str, Any]:
        """The body as RabbitMQ decodes it: empty or null is ``{}``, a non-object is a 400."""
        body = self.body.strip()
        if body in (b"", b"null", b"undefined"):
            return {}
        try:
            value = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            raise bad_request("not_json") from None
        if isinstance(value, dict):
            return value
        if isinstance(value, str):
            raise bad_request(
                "invalid payload: the request body JSON-decoded to a string. "
                "Is the input doubly-JSON-encoded?"
            )
        if value is None or isinstance(value, bool):
            return {}
        raise bad_request("not_json")

    @staticmethod
    def require(body: dict[str, Any], *keys: str) -> list[Any]:
        missing = [k for k in keys if body.get(k) is None]
        if missing:
            raise bad_request("[" + ",".join(f"{{key_missing,{k}}}" for k in missing) + "]")
        return [body[k] for k in keys]

    def vhost(self) -> VirtualHost:
        vhost = self.mgmt.broker.vhosts.get(self.params["vhost"])
        if vhost is None:
            raise not_found()
        return vhost

    def vhost_or_none(self) -> str | None:
        """The ``{vhost}`` of a list route, 404 if it names no vhost."""
        name = self.params.get("vhost")
        if name is not None and name not in self.mgmt.broker.vhosts:
            raise not_found()
        return name


@dataclass
class Route:
    segments: tuple[str, ...]
    handlers: dict[str, tuple[Handler, auth.Check]] = field(default_factory=dict)

    @property
    def literals(self) -> int:
        return sum(1 for s in self.segments if not s.startswith("{"))

    def match(self, parts: list[str]) -> dict[str, str] | None:
        if len(parts) != len(self.segments):
            return None
        params: dict[str, str] = {}
        for pattern, part in zip(self.segments, parts, strict=True):
            if pattern.startswith("{"):
                params[pattern[1:-1]] = part
            elif pattern != part:
                return None
        return params


class Resource:
    """The paths of one API resource, its handler for each method and the check that
    authorises them.

    Each resource family's module declares its resources as a tuple of these, as RabbitMQ's
    dispatcher maps paths to one resource module (rabbit_mgmt_dispatcher:dispatcher/0 sends
    ``/queues`` and ``/queues/:vhost`` to rabbit_mgmt_wm_queues); a path whose methods need
    different checks is declared once per check.
    """

    __slots__ = ("check", "methods", "paths")

    def __init__(self, *paths: str, check: auth.Check, **methods: Handler) -> None:
        self.paths = paths
        self.check = check
        self.methods = methods


class Router:
    def __init__(self, *families: Iterable[Resource]) -> None:
        self.routes: dict[tuple[str, ...], Route] = {}
        for resources in families:
            for resource in resources:
                for path in resource.paths:
                    for method, handler in resource.methods.items():
                        self.add(method, path, handler, resource.check)

    def add(self, method: str, path: str, handler: Handler, check: auth.Check) -> None:
        segments = tuple(path.strip("/").split("/"))
        route = self.routes.setdefault(segments, Route(segments))
        if method in route.handlers:  # two modules' tables would otherwise shadow silently
            raise ValueError(f"{method} /{path} is declared twice")
        route.handlers[method] = (handler, check)

    def find(self, parts: list[str]) -> tuple[Route, dict[str, str]] | None:
        """The matching route with the most literal segments (``/users/without-permissions``)."""
        best: tuple[Route, dict[str, str]] | None = None
        for route in self.routes.values():
            params = route.match(parts)
            if params is not None and (best is None or route.literals > best[0].literals):
                best = (route, params)
        return best


# ---- responses ----


def json_response(
    value: Any, status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    return web.Response(
        status=status,
        body=json.dumps(value, ensure_ascii=False).encode(),
        content_type="application/json",
        headers={"Cache-Control": "no-cache", **(headers or {})},
    )


def created(location: str | None = None) -> web.Response:
    headers = {"Location": location} if location is not None else None
    return web.Response(status=201, headers=headers)


def no_content() -> web.Response:
    return web.Response(status=204)


def error_response(exc: ApiError) -> web.Response:
    return json_response(exc.body(), exc.status, exc.headers)


def _columns(ctx: Ctx) -> list[list[str]] | None:
    spec = ctx.query("columns")
    if not spec:
        return None
    return [c.split(".") for c in spec.split(",") if c]


def extract_columns(item: Any, columns: list[list[str]] | None) -> Any:
    """RabbitMQ's ``columns=a,b.c``: keep only those keys, descending on dots."""
    if columns is None:
        return item
    if isinstance(item, list):
        return [extract_columns(i, columns) for i in item]
    if not isinstance(item, dict):
        return item
    out: dict[str, Any] = {}
    for key, value in item.items():
        below = [c[1:] for c in columns if c[0] == key]
        if not below:
            continue
        out[key] = value if any(not c for c in below) else extract_columns(value, below)
    return out


def reply(ctx: Ctx, value: Any) -> web.Response:
    return json_response(extract_columns(value, _columns(ctx)))


def _lookup(item: Any, path: list[str]) -> Any:
    for key in path:
        item = item.get(key) if isinstance(item, dict) else None
    return item


def _sort_key(value: Any) -> tuple[int, Any]:
    # numbers before strings before the rest, None last: a total order over JSON values
    if isinstance(value, bool):
        return (1, str(value))
    if isinstance(value, int | float):
        return (0, value)
    if isinstance(value, str):
        return (1, value)
    if value is None:
        return (3, "")
    return (2, json.dumps(value, sort_keys=True))


@dataclass(frozen=True)
class Lazy:
    """Objects whose JSON is built only for the rows a page shows.

    ``fields`` gives cheap values (``name`` at least) for the name filter and the
    usual sort keys; a sort on any other key builds every row. With 10,000 queues,
    a page sorted by depth then costs 10,000 attribute reads, not 10,000 objects.
    """

    objects: list[Any]
    render: Callable[[Any], dict[str, Any]]
    fields: dict[str, Callable[[Any], Any]]


def reply_list(
    ctx: Ctx, items: Iterable[dict[str, Any]] | Lazy, sort: tuple[str, ...] = ("vhost", "name")
) -> web.Response:
    """A sorted list, with RabbitMQ's ``sort``, ``sort_reverse``, ``columns`` and pagination."""
    by = ctx.query("sort")
    keys = [*([by] if by else []), *sort]  # the default order breaks ties: stable pages
    if isinstance(items, Lazy):
        fields = items.fields
        if all(k in fields for k in keys):
            getters = [fields[k] for k in keys]
            return _reply_rows(ctx, items.objects, getters, fields["name"], items.render)
        items = [items.render(o) for o in items.objects]
    paths = [k.split(".") for k in keys]
    getters = [lambda row, p=p: _lookup(row, p) for p in paths]  # type: ignore[misc]
    return _reply_rows(ctx, list(items), getters, lambda row: row.get("name"), None)


def _reply_rows(
    ctx: Ctx,
    rows: list[Any],
    getters: list[Callable[[Any], Any]],
    name_of: Callable[[Any], Any],
    render: Callable[[Any], dict[str, Any]] | None,
) -> web.Response:
    page = ctx.query("page")
    paging = None if page is None else _pagination(ctx, page)
    total = len(rows)
    if paging is not None:
        rows = _name_filter(ctx, rows, name_of)  # before sorting: fewer rows to sort
    rows.sort(key=lambda row: tuple(_sort_key(get(row)) for get in getters))
    if ctx.query("sort_reverse") == "true":
        rows.reverse()
    if paging is None:
        return reply(ctx, rows if render is None else [render(r) for r in rows])
    number, size = paging
    if (number - 1) * size > len(rows):
        raise ApiError(
            400,
            "page_out_of_range",
            f"Page out of range, page: {number} page size: {size}, len: {len(rows)}",
        )
    shown = rows[(number - 1) * size : number * size]
    if render is not None:
        shown = [render(r) for r in shown]
    return json_response(  # ``columns`` picks the items' fields, not the envelope's
        {
            "filtered_count": len(rows),
            "item_count": len(shown),
            "items": extract_columns(shown, _columns(ctx)),
            "page": number,
            "page_count": -(-len(rows) // size),
            "page_size": size,
            "total_count": total,
        }
    )


MAX_PAGE_SIZE = 500  # RabbitMQ's


def _pagination(ctx: Ctx, page_text: str) -> tuple[int, int]:
    """``page`` and ``page_size`` with RabbitMQ's two errors: not a number, or out of bounds."""
    size_text = ctx.query("page_size")
    try:
        page = int(page_text)
        size = 100 if size_text is None else int(size_text)
    except ValueError:
        raise bad_request("Pagination parameters are invalid") from None
    if page < 1 or not 1 <= size <= MAX_PAGE_SIZE:
        shown = "undefined" if size_text is None else size
        raise ApiError(
            400,
            "invalid_pagination_parameters",
            f"Invalid pagination parameters: page number {page}, page size {shown}",
        )
    return page, size


def _name_filter(ctx: Ctx, rows: list[Any], name_of: Callable[[Any], Any]) -> list[Any]:
    """RabbitMQ's ``name`` filter: a substring or, with ``use_regex``, a regex; any case."""
    name = ctx.query("name")
    if not name:
        return rows
    if ctx.query("use_regex") == "true":
        try:
            pattern = re.compile(name, re.IGNORECASE)
        except re.error:
            raise bad_request("Pagination parameters are invalid") from None
        return [r for r in rows if pattern.search(str(name_of(r) or ""))]
    needle = name.lower()
    return [r for r in rows if needle in str(name_of(r) or "").lower()]


# ---- the server ----


def _split(raw_path: str) -> list[str] | None:
    if raw_path != "/api" and not raw_path.startswith("/api/"):
        return None
    parts = raw_path[len("/api/") :].split("/") if raw_path != "/api" else []
    if parts and parts[-1] == "" and len(parts) > 1:
        parts.pop()  # a trailing slash
    return parts


# Cross-site requests. A page on another origin can make the browser send a POST without a
# CORS preflight only as a form (text/plain, urlencoded, multipart) or with no body at all,
# and the browser attaches basic-auth credentials it has cached for this host. It cannot
# send ``application/json`` without a preflight, and preflights get no Access-Control-Allow-*
# headers here. So a POST must declare JSON, and so must any request that carries a body
# (PUT, PATCH and DELETE always need a preflight; a bodiless one is what curl sends for
# ``PUT /api/vhosts/x``, which RabbitMQ accepts). RabbitMQ's definitions resource refuses other
# bodies with 415 (rabbit_mgmt_wm_definitions:content_types_accepted); Warren does so on every
# route, where RabbitMQ's other resources accept any type ('*').
_JSON = "application/json"


def _unsupported_media_type(method: str, request: web.Request) -> ApiError | None:
    if method not in ("POST", "PUT", "PATCH", "DELETE"):
        return None
    declared = request.headers.get("Content-Type")
    if declared is not None and declared.split(";", 1)[0].strip().lower() == _JSON:
        return None
    if method != "POST" and declared is None and not _has_body(request):
        return None
    return ApiError(
        415,
        "unsupported_media_type",
        f"{method} requests must have Content-Type: {_JSON} (got {declared or 'none'})",
    )


def _has_body(request: web.Request) -> bool:
    return bool(request.content_length) or "chunked" in request.headers.get(
        "Transfer-Encoding", ""
    ).lower()


class ManagementApp:
    def __init__(self, mgmt: Management, router: Router) -> None:
        self.mgmt = mgmt
        self.router = router
        self.app = web.Application(client_max_size=MAX_BODY)
        self.app.router.add_route("*", "/{tail:.*}", self.handle)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        try:
            return await self._handle(request)
        except ApiError as exc:
            if request.headers.get("X-Requested-With") == "XMLHttpRequest":
                # a script handles its own 401: a challenge would make a browser prompt, or
                # a headless one wait, instead of letting the console show the reason
                exc.headers.pop("WWW-Authenticate", None)
            return error_response(exc)
        except web.HTTPRequestEntityTooLarge:
            return error_response(ApiError(413, "bad_request", "request body too large"))
        except Exception:  # a bug must answer 500, never a stack trace
            self.mgmt.broker.log.exception("management API error", path=request.path)
            return error_response(ApiError(500, "internal_server_error", "internal error"))

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        parts = _split(request.rel_url.raw_path)
        if parts is None:  # outside /api: the console's public files, or 404
            page = console.serve(request.rel_url.raw_path, request.method)
            if page is not None:
                return page
        found = self.router.find([unquote(p) for p in parts]) if parts is not None else None
        if found is None or parts is None:
            raise not_found()
        route, params = found
        method = "GET" if request.method == "HEAD" else request.method
        allowed = sorted(route.handlers)
        if method == "OPTIONS":
            return web.Response(status=200, headers={"Allow": ", ".join([*allowed, "OPTIONS"])})
        if method not in route.handlers:
            raise method_not_allowed(allowed)
        handler, check = route.handlers[method]
        if check is auth.public:  # a route anyone may read, before logging in (GET /api/auth)
            user = auth.ANONYMOUS
        else:
            user = auth.authenticate(
                self.mgmt, request.headers.get("Authorization"), request.remote
            )
        ctx = Ctx(self.mgmt, request, method, params, user)
        check(ctx)
        refusal = _unsupported_media_type(method, request)
        if refusal is not None:
            raise refusal
        if request.can_read_body:
            ctx.body = await request.read()
        try:
            return handler(ctx)
        except AMQPError as exc:
            raise from_operation(exc) from None


class HttpSite:
    """One aiohttp server on the running loop; port 0 picks a free port.

    Its listening sockets are served by our own ``create_server`` rather than aiohttp's
    sites, so that ``admit`` (the descriptor reserve, broker/server/shell.py) can close
    a connection the moment it is accepted, before aiohttp reads a byte of it."""

    def __init__(self, app: web.Application, admit: Callable[[], bool] | None = None) -> None:
        self.runner = web.AppRunner(app, access_log=None, handle_signals=False)
        self.admit = admit
        self.port = 0
        self.servers: list[asyncio.Server] = []

    def _protocol(self) -> asyncio.BaseProtocol:
        if self.admit is not None and not self.admit():
            return _Refused()
        server = self.runner.server
        assert server is not None
        return server()

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host`` as RabbitMQ's HTTP listeners do (broker/server/listen.py)."""
        await self.runner.setup()
        loop = asyncio.get_running_loop()
        for sock in listen_sockets(host, port):
            self.servers.append(await loop.create_server(self._protocol, sock=sock, backlog=128))
        self.port = int(self.servers[0].sockets[0].getsockname()[1])
        return self.port

    async def stop(self) -> None:
        for server in self.servers:
            server.close()
        self.servers.clear()
        await self.runner.cleanup()  # closes the connections still open


class _Refused(asyncio.Protocol):
    """A connection over the descriptor reserve: closed before anything is read."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.abort()  # type: ignore[attr-defined]
