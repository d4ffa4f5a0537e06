"""Listening sockets opened as RabbitMQ opens them (rabbit_networking, Erlang's gen_tcp).

A listener given only a port (``listeners.tcp.default = 5672``, ``--port``; host ``""``
in :class:`config.Listener`) takes every address: ``::``, which on Linux also takes IPv4
(one socket), plus ``0.0.0.0`` where the system keeps the two apart
(``net.ipv6.bindv6only = 1``), and ``0.0.0.0`` alone where the host has no IPv6. A
client that resolves ``localhost`` to ``::1`` first (Node.js 17 and later, many Docker
and macOS set-ups) then connects. An explicit ``::`` keeps the system's dual-stack
default too, as Erlang does; asyncio's own ``create_server`` would make it IPv6-only.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import socket
from collections.abc import Iterator
from typing import Any

ALL_ADDRESSES = ""  # Listener.host of a port-only listener
# errors of a kernel without IPv6 (Linux, FreeBSD): such a host listens on IPv4 only
_NO_IPV6 = (errno.EAFNOSUPPORT, errno.EPROTONOSUPPORT, errno.EADDRNOTAVAIL)


class ListenError(OSError):
    """A listener that could not bind, named by its address, its setting and the flag that
    moves it: "Address already in use" alone does not say which of three ports is taken."""

    def __init__(self, exc: OSError, host: str, port: int, setting: str, flag: str) -> None:
        where = f"[{host}]" if ":" in host else (host or "0.0.0.0")
        super().__init__(
            exc.errno,
            f"{where}:{port}: {exc.strerror or exc} (this is {setting} in the configuration"
            f" file{f'; {flag} moves it' if flag else ''})",
        )


@contextlib.contextmanager
def naming(host: str, port: int, setting: str, flag: str) -> Iterator[None]:
    """Re-raise an OSError from binding as a ListenError that names the listener."""
    try:
        yield
    except ListenError:
        raise
    except OSError as exc:
        raise ListenError(exc, host, port, setting, flag) from exc


def listen_sockets(host: str, port: int, backlog: int = 1024) -> list[socket.socket]:
    """Bound, listening, non-blocking sockets for ``host``:``port`` (port 0: a free one)."""
    if host == ALL_ADDRESSES:
        return _all_addresses(port, backlog)
    sockets: list[socket.socket] = []
    try:
        for family, address in _resolve(host):
            # a name with an IPv4 and an IPv6 address: both on the same (maybe chosen) port
            sock = _bind(family, address, sockets[0].getsockname()[1] if sockets else port)
            sockets.append(sock)
            sock.listen(backlog)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def _all_addresses(port: int, backlog: int) -> list[socket.socket]:
    """rabbit_networking:port_to_listeners: ``::``; ``0.0.0.0`` beside it or instead."""
    try:
        six = _bind(socket.AF_INET6, "::", port)
    except OSError as exc:
        if exc.errno not in _NO_IPV6:
            raise
        four = _bind(socket.AF_INET, "0.0.0.0", port)
        four.listen(backlog)
        return [four]
    sockets = [six]
    try:
        if six.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY):
            sockets.append(_bind(socket.AF_INET, "0.0.0.0", six.getsockname()[1]))
        for sock in sockets:
            sock.listen(backlog)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def _resolve(host: str) -> list[tuple[socket.AddressFamily, str]]:
    """An address as it is; a name as RabbitMQ's getaddr: its first IPv4 and IPv6 address."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        return [(socket.AF_INET6 if ip.version == 6 else socket.AF_INET, str(ip))]
    found: list[tuple[socket.AddressFamily, str]] = []
    for family in (socket.AF_INET, socket.AF_INET6):
        with contextlib.suppress(OSError):
            info = socket.getaddrinfo(host, None, family, socket.SOCK_STREAM)
            if info:
                found.append((family, str(info[0][4][0])))
    if not found:
        raise OSError(errno.EADDRNOTAVAIL, f"cannot resolve {host!r} to an address to listen on")
    return found


def _bind(family: socket.AddressFamily, address: str, port: int) -> socket.socket:
    # IPV6_V6ONLY is left at the system's default (Linux: off), as Erlang leaves it
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address, port))
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def display_host(host: str) -> str:
    """``::ffff:127.0.0.1`` (an IPv4 peer on a dual-stack socket) as ``127.0.0.1``, as
    RabbitMQ shows it (rabbit_misc:ntoa); other addresses unchanged."""
    if host.startswith("::ffff:") and "." in host:
        return host[7:]
    return host


def transport_address(transport: Any, which: str) -> tuple[str, int]:
    """One end of a connection (``which``: peername or sockname), as RabbitMQ shows it;
    ``("?", 0)`` for a transport that does not know (an in-memory one)."""
    try:
        info = transport.get_extra_info(which)
    except Exception:  # a test transport without extra info
        info = None
    if not info:
        return ("?", 0)
    return (display_host(str(info[0])), int(info[1]))
