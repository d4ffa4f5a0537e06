"""The web console: static HTML, CSS and JavaScript modules served by the management server.

The files are public (``/`` and ``/console/...``); the page logs in against the API with
HTTP basic auth, so everything it shows or changes passes the API's own tag and
permission checks. Files are read once, and only names found in ``static/`` are served,
so no request path ever reaches the file system.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from aiohttp import web

STATIC = Path(__file__).parent / "static"
PREFIX = "/console/"
TYPES = {
    ".html": "text/html",
    ".css": "text/css",
    ".js": "text/javascript",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".txt": "text/plain",
}
HEADERS = {
    "Cache-Control": "no-cache",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; "
        "frame-ancestors 'none'; form-action 'self'"
    ),
}


@cache
def files() -> dict[str, tuple[bytes, str]]:
    """Every shipped file by its URL name, with its content type."""
    out: dict[str, tuple[bytes, str]] = {}
    for path in STATIC.iterdir():
        kind = TYPES.get(path.suffix)
        if kind is not None and path.is_file():
            out[path.name] = (path.read_bytes(), kind)
    return out


def serve(raw_path: str, method: str) -> web.Response | None:
    """The console file at this path, or None (the caller answers 404)."""
    if raw_path == "/":
        name = "index.html"
    elif raw_path.startswith(PREFIX):
        name = raw_path[len(PREFIX) :]
    else:
        return None
    found = files().get(name)
    if found is None:
        return None
    if method not in ("GET", "HEAD"):
        return web.Response(status=405, headers={"Allow": "GET, HEAD"})
    body, kind = found
    charset = "utf-8" if kind.startswith("text/") or kind.endswith("+xml") else None
    return web.Response(body=body, content_type=kind, charset=charset, headers=HEADERS)
