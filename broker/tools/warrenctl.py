"""``warrenctl``: rabbitmqctl's verbs and argument order, over Warren's management API.

    warrenctl list_queues -p /orders name messages consumers
    warrenctl set_policy --apply-to queues --priority 1 ttl "^tmp\\." '{"message-ttl":60000}'
    warrenctl --formatter json list_users

The broker is found from the local configuration (``management.tcp.port``,
``default_user``/``default_pass``, ``$RABBITMQ_CONFIG_FILE``) unless ``--url``
says otherwise (``http://user:pass@host:15672``). It imports only the standard
library and config/, so it starts fast and runs where the broker is not installed.

Exit status follows rabbitmqctl (sysexits): 0 ok, 64 bad arguments, 65 a value the
broker rejected, 67 no such user, 69 broker unreachable or object missing,
77 bad credentials or not allowed, 70 anything else.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any, NoReturn
from urllib.parse import quote, unquote, urlsplit

from warren.broker.tools import ENDPOINTS_FILE

EX_USAGE, EX_DATAERR, EX_NOUSER, EX_UNAVAILABLE, EX_SOFTWARE, EX_NOPERM = 64, 65, 67, 69, 70, 77


class CtlError(Exception):
    """Printed as rabbitmqctl prints errors: ``Error:`` on a line of its own, then the text;
    ``bare`` errors (rabbitmqctl's "does not exist" of delete_vhost) print the text alone."""

    def __init__(self, message: str, code: int = EX_SOFTWARE, bare: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.bare = bare


class HttpError(CtlError):
    def __init__(self, status: int, reason: str) -> None:
        code = {400: EX_DATAERR, 401: EX_NOPERM, 404: EX_UNAVAILABLE, 409: EX_UNAVAILABLE}.get(
            status, EX_SOFTWARE
        )
        super().__init__(reason, code)
        self.status = status


# ---- the HTTP client ----


class Api:
    def __init__(self, url: str, user: str, password: str, timeout: float) -> None:
        parts = urlsplit(url if "://" in url else "http://" + url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise CtlError(f"invalid --url '{url}': expected http://host:port", EX_USAGE)
        self.user = unquote(parts.username) if parts.username else user
        self.password = unquote(parts.password) if parts.password else password
        host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
        port = f":{parts.port}" if parts.port else ""
        self.base = f"{parts.scheme}://{host}{port}{parts.path.rstrip('/')}"
        self.timeout = timeout
        self.source = "--url"  # where the address came from, said when nothing answers

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        headers: dict[str, str] | None = None,
    ) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + "/api/" + path, data=data, method=method)
        token = base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
        req.add_header("Authorization", "Basic " + token)
        if data is not None or method in ("POST", "PUT"):  # the API refuses undeclared POSTs
            req.add_header("Content-Type", "application/json")
        for key, value in (headers or {}).items():
            req.add_header(key, value)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            raise HttpError(exc.code, _reason(exc)) from None
        except (urllib.error.URLError, OSError) as exc:
            why = getattr(exc, "reason", exc)
            raise CtlError(
                f"unable to reach Warren at {self.base} ({self.source}): {why}", EX_UNAVAILABLE
            ) from None
        return json.loads(raw) if raw else None

    def get(self, path: str) -> Any:
        return self.request("GET", path)


def _reason(exc: urllib.error.HTTPError) -> str:
    try:
        body = json.loads(exc.read() or b"{}")
    except ValueError:
        body = {}
    reason = body.get("reason") if isinstance(body, dict) else None
    if reason is None:
        return f"HTTP {exc.code} {exc.reason}"
    return reason if isinstance(reason, str) else json.dumps(reason)


def q(name: str) -> str:
    """A path segment: names may hold '/', as the default vhost does."""
    return quote(name, safe="")


# ---- output ----


def _cell(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return ""
    if isinstance(value, list):
        return "[" + ", ".join(_cell(v) for v in value) + "]"
    if isinstance(value, dict):
        return json.dumps(value, separators=(",", ":")) if value else "[]"
    return str(value)


def _lookup(item: Any, path: str) -> Any:
    for key in path.split("."):
        item = item.get(key) if isinstance(item, dict) else None
    return item


class Output:
    def __init__(self, args: argparse.Namespace) -> None:
        self.json = args.formatter == "json"
        self.quiet = args.quiet or args.silent or self.json
        self.headers = not (args.no_table_headers or args.silent)

    def info(self, text: str) -> None:
        if not self.quiet:
            print(text)

    def rows(
        self,
        items: list[dict[str, Any]],
        columns: list[str],
        aliases: dict[str, str],
        validated: bool = False,
    ) -> None:
        """``validated``: the columns were checked against the verb's info keys already."""
        paths = [aliases.get(c, c) for c in columns]
        if items and not validated:
            for column, path in zip(columns, paths, strict=True):
                if all(_lookup(i, path) is None for i in items) and not _known(items[0], path):
                    known = ", ".join(sorted(_columns(items[0], aliases)))
                    raise CtlError(
                        f"(argument validation): Info key(s) {column} are not supported "
                        f"(known: {known})",
                        EX_USAGE,
                    )
        table = [[_lookup(i, p) for p in paths] for i in items]
        if self.json:
            print_json_rows([dict(zip(columns, row, strict=True)) for row in table])
            return
        if self.headers and table:  # rabbitmqctl prints no header over an empty listing
            print("\t".join(columns))
        for row in table:
            print("\t".join(_cell(v) for v in row))

    def document(self, value: Any) -> None:
        print(json.dumps(value, indent=2, sort_keys=True))


def print_json_rows(rows: list[dict[str, Any]]) -> None:
    """rabbitmqctl's JSON formatter for a listing: one object a line, so a stream can be
    read a row at a time, and the whole a JSON array (``[``, rows with ``,`` before all
    but the first, ``]``)."""
    print("[")
    for i, row in enumerate(rows):
        print(("," if i else "") + json.dumps(row, separators=(",", ":")))
    print("]")


def _known(item: dict[str, Any], path: str) -> bool:
    head, _, rest = path.partition(".")
    if head not in item:
        return False
    return not rest or isinstance(item[head], dict)


def _columns(item: dict[str, Any], aliases: dict[str, str]) -> set[str]:
    return set(item) | {a for a, p in aliases.items() if p.split(".")[0] in item}


# ---- commands ----

Command = Callable[[Api, argparse.Namespace, Output], None]
COMMANDS: dict[str, tuple[Command, str, Callable[[argparse.ArgumentParser], object]]] = {}


def command(
    name: str, help_text: str, arguments: Callable[[argparse.ArgumentParser], object] | None = None
) -> Callable[[Command], Command]:
    def register(fn: Command) -> Command:
        COMMANDS[name] = (fn, help_text, arguments or (lambda p: None))
        return fn

    return register


def _columns_arg(default: list[str]) -> Callable[[argparse.ArgumentParser], object]:
    def add(p: argparse.ArgumentParser) -> None:
        p.add_argument("columns", nargs="*", metavar="column", help=f"default: {' '.join(default)}")
        p.set_defaults(default_columns=default)

    return add


def _list(
    name: str,
    what: str,
    path: Callable[[argparse.Namespace], str],
    default: list[str],
    aliases: dict[str, str] | None = None,
    per_vhost: bool = True,
    prepare: Callable[[dict[str, Any]], None] | None = None,
    heading: str = "Listing {what} for vhost {vhost} ...",
    missing_vhost_fails: bool = False,
    info_keys: tuple[str, ...] | None = None,
) -> None:
    """A listing verb. rabbitmqctl's headings differ per verb (quotes, "in", a missing
    space); a vhost that does not exist is an empty listing, except where rabbitmqctl
    says so and exits 65 (list_policies, list_permissions)."""

    def run(api: Api, args: argparse.Namespace, out: Output) -> None:
        if name == "list_queues":  # the one listing rabbitmqctl heads with its timeout
            out.info(f"Timeout: {args.timeout} seconds ...")
        columns = args.columns or args.default_columns
        if info_keys is not None:  # rabbitmqctl checks them before it asks the node
            unknown = sorted(set(columns) - set(info_keys))
            if unknown:
                raise CtlError(
                    f"(argument validation): Info key(s) {','.join(unknown)} are not supported",
                    EX_USAGE,
                )
        out.info(heading.format(what=what, vhost=args.vhost))
        try:
            items = api.get(path(args))
        except HttpError as exc:
            if exc.status == 404 and per_vhost:
                if missing_vhost_fails:
                    raise _no_vhost(args.vhost, bare=True) from None
                items = []
            else:
                raise
        if prepare is not None:
            for item in items:
                prepare(item)
        if info_keys is not None:
            derive = DERIVED.get(name)
            if derive is not None:
                derive(api, args, items, columns)
            for item in items:  # a key the object does not have: rabbitmqctl's ''
                for column in columns:
                    if _lookup(item, (aliases or {}).get(column, column)) is None:
                        item.setdefault(column, "")
        if name == "list_policies" and not items and not out.quiet:
            print()  # rabbitmqctl's empty policy listing is one empty line
        out.rows(items, columns, aliases or {}, validated=info_keys is not None)

    command(name, f"list {what}", _columns_arg(default))(run)


# rabbitmqctl's info keys of each listing (RabbitMQ 4.3, deps/rabbitmq_cli/lib/rabbitmq/cli/
# ctl/commands/list_*_command.ex, @info_keys); the API's field of the same name unless
# DERIVED computes it
QUEUE_KEYS = (
    "name", "durable", "auto_delete", "arguments", "policy", "operator_policy",
    "effective_policy_definition", "pid", "owner_pid", "exclusive", "exclusive_consumer_pid",
    "exclusive_consumer_tag", "messages_ready", "messages_unacknowledged", "messages",
    "messages_ready_ram", "messages_unacknowledged_ram", "messages_ram", "messages_persistent",
    "message_bytes", "message_bytes_ready", "message_bytes_unacknowledged", "message_bytes_ram",
    "message_bytes_persistent", "head_message_timestamp", "disk_reads", "disk_writes",
    "consumers", "consumer_utilisation", "consumer_capacity", "memory", "state", "type",
    "leader", "members", "online",
    "messages_delayed",  # Warren's own: messages waiting for a delayed retry
)  # fmt: skip
EXCHANGE_KEYS = (
    "name", "type", "durable", "auto_delete", "internal", "arguments", "policy",
    "messages_delayed",  # Warren's own: what an x-delayed-message exchange holds
)  # fmt: skip
CONNECTION_KEYS = (
    "pid", "name", "port", "host", "peer_port", "peer_host", "ssl", "ssl_protocol",
    "ssl_key_exchange", "ssl_cipher", "ssl_hash", "peer_cert_subject", "peer_cert_issuer",
    "peer_cert_serial_number", "peer_cert_validity", "state", "channels", "protocol",
    "auth_mechanism", "user", "vhost", "container_id", "timeout", "frame_max", "channel_max",
    "client_properties", "recv_oct", "recv_cnt", "send_oct", "send_cnt", "send_pend",
    "connected_at",
)  # fmt: skip
CHANNEL_KEYS = (
    "pid", "connection", "name", "number", "user", "vhost", "transactional", "confirm",
    "consumer_count", "messages_unacknowledged", "messages_uncommitted", "acks_uncommitted",
    "messages_unconfirmed", "prefetch_count",
)  # fmt: skip


def _queue_keys(api: Api, args: argparse.Namespace, items: list[dict[str, Any]],
                columns: list[str]) -> None:  # fmt: skip
    """The queue keys the API has under another shape: the process ids (Warren's: the
    node, vhost and name that identify the queue, the owner's connection, the exclusive
    consumer's channel) and the replicas (one node: it leads every quorum queue and
    stream; a classic queue has none, rabbitmqctl prints '')."""
    channels: dict[str, str] = {}
    if "exclusive_consumer_pid" in columns and any(i.get("exclusive_consumer_tag") for i in items):
        for consumer in api.get(f"consumers/{q(args.vhost)}"):
            key = consumer["queue"]["name"] + "\0" + consumer["consumer_tag"]
            channels[key] = consumer["channel_details"]["name"]
    for item in items:
        node = item.get("node", "")
        item["pid"] = f"<{node}.{item.get('vhost')}.{item.get('name')}>"
        item["owner_pid"] = (item.get("owner_pid_details") or {}).get("name", "")
        tag = item.get("exclusive_consumer_tag")
        item["exclusive_consumer_pid"] = channels.get(f"{item.get('name')}\0{tag}", "")
        replicated = item.get("type") in ("quorum", "stream")
        item["leader"] = node if replicated else ""
        item["members"] = item["online"] = [node] if replicated else ""


DERIVED: dict[
    str, Callable[[Api, argparse.Namespace, list[dict[str, Any]], list[str]], None]
] = {"list_queues": _queue_keys}


_list(
    "list_queues",
    "queues",
    lambda a: f"queues/{q(a.vhost)}",
    ["name", "messages"],
    info_keys=QUEUE_KEYS,
)
_list(
    "list_exchanges",
    "exchanges",
    lambda a: f"exchanges/{q(a.vhost)}",
    ["name", "type"],
    info_keys=EXCHANGE_KEYS,
)
_list(
    "list_bindings",
    "bindings",
    lambda a: f"bindings/{q(a.vhost)}",
    [
        "source_name",
        "source_kind",
        "destination_name",
        "destination_kind",
        "routing_key",
        "arguments",
    ],
    {
        "source_name": "source",
        "destination_name": "destination",
        "destination_kind": "destination_type",
    },
    prepare=lambda b: b.setdefault("source_kind", "exchange"),
    heading="Listing {what} for vhost {vhost}...",
)
_list(
    "list_connections",
    "connections",
    lambda a: "connections",
    ["user", "peer_host", "peer_port", "state"],
    {"pid": "name", "connection_name": "user_provided_name"},
    per_vhost=False,
    heading="Listing {what} ...",
    info_keys=(*CONNECTION_KEYS, "connection_name"),
)
_list(
    "list_channels",
    "channels",
    lambda a: "channels",
    ["pid", "user", "consumer_count", "messages_unacknowledged"],
    {"pid": "name", "connection": "connection_details.name"},
    per_vhost=False,
    heading="Listing {what} ...",
    info_keys=CHANNEL_KEYS,
)
_list(
    "list_consumers",
    "consumers",
    lambda a: f"consumers/{q(a.vhost)}",
    [
        "queue_name",
        "channel_pid",
        "consumer_tag",
        "ack_required",
        "prefetch_count",
        "active",
        "arguments",
    ],
    {"queue_name": "queue.name", "channel_pid": "channel_details.name"},
    heading="Listing {what} in vhost {vhost} ...",
)
_list(
    "list_policies",
    "policies",
    lambda a: f"policies/{q(a.vhost)}",
    ["vhost", "name", "pattern", "apply-to", "definition", "priority"],
    heading='Listing {what} for vhost "{vhost}" ...',
    missing_vhost_fails=True,
)
_list(
    "list_permissions",
    "permissions",
    lambda a: f"vhosts/{q(a.vhost)}/permissions",
    ["user", "configure", "write", "read"],
    heading='Listing {what} for vhost "{vhost}" ...',
    missing_vhost_fails=True,
)
_list(
    "list_users",
    "users",
    lambda a: "users",
    ["user", "tags"],
    {"user": "name"},
    False,
    heading="Listing {what} ...",
)
_list(
    "list_vhosts",
    "vhosts",
    lambda a: "vhosts",
    ["name"],
    per_vhost=False,
    heading="Listing {what} ...",
)


def _no_vhost(vhost: str, *, bare: bool = False) -> CtlError:
    """rabbitmqctl's two ways to say it: quoted and 65 where the verb checks first,
    unquoted and 69 where the operation itself fails."""
    if bare:
        return CtlError(f"Virtual host '{vhost}' does not exist", EX_DATAERR, bare=True)
    return CtlError(f"Virtual host {vhost} does not exist", EX_UNAVAILABLE)


def _deprecated_args(p: argparse.ArgumentParser) -> None:
    _columns_arg(["name", "deprecation_phase", "state"])(p)
    p.add_argument("--used", action="store_true", help="only the deprecated features in use")


@command("list_deprecated_features", "list deprecated features", _deprecated_args)
def list_deprecated_features(api: Api, args: argparse.Namespace, out: Output) -> None:
    # rabbitmqctl's verb: without --used a `state` column (permitted or denied)
    out.info(
        "Listing deprecated features in use ..." if args.used else "Listing deprecated features ..."
    )
    path = "deprecated-features/used" if args.used else "deprecated-features"
    out.rows(api.get(path), args.columns or args.default_columns, {})


@command(
    "list_user_permissions",
    "list a user's permissions in every vhost",
    lambda p: p.add_argument("username"),
)
def list_user_permissions(api: Api, args: argparse.Namespace, out: Output) -> None:
    out.info(f'Listing permissions for user "{args.username}" ...')
    try:
        items = api.get(f"users/{q(args.username)}/permissions")
    except HttpError as exc:
        if exc.status == 404:  # rabbitmqctl shows the Erlang error term here, and exits 69
            raise CtlError(f'{{:no_such_user, "{args.username}"}}', EX_UNAVAILABLE) from None
        raise
    if not items and not out.quiet:
        print()  # as list_policies: rabbitmqctl's empty listing is one empty line
    out.rows(items, ["vhost", "configure", "write", "read"], {})


def _user_call(api: Api, name: str, fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except HttpError as exc:
        if exc.status == 404:
            raise CtlError(f'User "{name}" does not exist', EX_NOUSER) from None
        raise


def _user(api: Api, name: str) -> dict[str, Any]:
    user: dict[str, Any] = _user_call(api, name, lambda: api.get(f"users/{q(name)}"))
    return user


LISTENER_PURPOSES = {
    "amqp": "AMQP 0-9-1",
    "amqp/ssl": "AMQP 0-9-1 over TLS",
    "http": "HTTP API",
    "http/prometheus": "Prometheus exporter API over HTTP",
}


def _gb(value: Any) -> str:
    return "unknown" if value is None else f"{value / 1e9:.4f} gb"


@command("status", "show the broker's status")
def status(api: Api, args: argparse.Namespace, out: Output) -> None:
    """rabbitmqctl status's sections and wording, those that apply to one Warren node."""
    overview = api.get("overview")
    try:
        health = api.get("health/checks/alarms")
    except HttpError as exc:
        if exc.status != 503:
            raise
        health = {"status": "failed", "alarms": []}
    alarms = health.get("alarms", []) if isinstance(health, dict) else []
    node = _optional(api, f"nodes/{q(str(overview.get('node')))}") or {}
    vhosts = _optional(api, "vhosts")
    if out.json:
        document = _status_document(overview, node, vhosts, alarms)
        document["broker"], document["found"] = api.base, api.source  # Warren's own
        print(json.dumps(document, separators=(",", ":")))
        return
    totals = overview.get("object_totals", {})
    lines = [
        f"Status of node {overview.get('node')} ...",
        "Runtime",
        "",
        f"Uptime (seconds): {int(overview.get('uptime', 0)) // 1000}",
        "Is under maintenance?: false",
        f"Product name: {overview.get('product_name')}",
        f"Product version: {overview.get('product_version')}",
        f"Build: {overview.get('warren_build', 'unknown')}",
        f"RabbitMQ version: {overview.get('rabbitmq_version')} (management API compatibility)",
        f"Node name: {overview.get('node')}",
        f"Broker: {api.base} ({api.source})",
        "",
        "Alarms",
        "",
        *([f"{a.get('resource', '?')} alarm" for a in alarms] or ["(none)"]),
        "",
        "Memory",
        "",
        f"Total memory used: {_gb(node.get('mem_used'))}",
        "Calculation strategy: rss",
        f"Memory high watermark: {_gb(node.get('mem_limit'))}",
        "",
        "Free Disk Space",
        "",
        f"Low free disk space watermark: {_gb(node.get('disk_free_limit'))}",
        f"Free disk space: {_gb(node.get('disk_free'))}",
        "",
        "Totals",
        "",
        f"Connection count: {totals.get('connections', 0)}",
        f"Queue count: {totals.get('queues', 0)}",
        f"Virtual host count: {'unknown' if vhosts is None else len(vhosts)}",
        "",
        "Listeners",
        "",
    ]
    for listener in overview.get("listeners", []):
        protocol = listener["protocol"]
        lines.append(
            f"Interface: {listener['ip_address']}, port: {listener['port']}, protocol: "
            f"{protocol}, purpose: {LISTENER_PURPOSES.get(protocol, protocol)}"
        )
    print("\n".join(lines))


def _status_document(
    overview: dict[str, Any], node: dict[str, Any], vhosts: Any, alarms: list[Any]
) -> dict[str, Any]:
    """rabbitmqctl status --formatter json's 29 keys (RabbitMQ 4.3, rabbitmq_cli's
    status_command.ex and rabbit:status/0), from the API's overview and node; what has no
    Erlang here says what stands in for it."""
    totals = overview.get("object_totals", {})
    memory_used = node.get("mem_used")
    return {
        "active_plugins": node.get("enabled_plugins", []),
        "alarms": alarms,
        "config_files": node.get("config_files", []),
        "crypto_lib_version": "",
        "data_directory": node.get("db_dir", ""),
        "disk_free": node.get("disk_free"),
        "disk_free_limit": node.get("disk_free_limit"),
        "enabled_plugin_file": "",  # Warren's plugins are built in: no such file
        "erlang_version": f"Python {overview.get('python_version', '')}",
        "file_descriptors": {
            "sockets_limit": node.get("sockets_total"),
            "sockets_used": node.get("sockets_used"),
            "total_limit": node.get("fd_total"),
            "total_used": node.get("fd_used"),
        },
        "is_under_maintenance": bool(node.get("being_drained", False)),
        "listeners": [
            {
                "interface": listener.get("ip_address"),
                "node": listener.get("node"),
                "port": listener.get("port"),
                "protocol": listener.get("protocol"),
                "purpose": LISTENER_PURPOSES.get(listener.get("protocol"), ""),
            }
            for listener in overview.get("listeners", [])
        ],
        "log_files": node.get("log_files", []),
        "memory": {"total": {"rss": memory_used}, "strategy": "rss"},
        "net_ticktime": node.get("net_ticktime", 60),
        "os": sys.platform.capitalize() if sys.platform != "linux" else "Linux",
        "pid": int(node["os_pid"]) if str(node.get("os_pid", "")).isdigit() else None,
        "processes": {"limit": node.get("proc_total"), "used": node.get("proc_used")},
        "product_name": overview.get("product_name"),
        "product_version": overview.get("product_version"),
        "rabbitmq_version": overview.get("rabbitmq_version"),
        "raft_data_directory": node.get("db_dir", ""),
        "release_series_support_status": "supported",
        "run_queue": node.get("run_queue"),
        "totals": {
            "virtual_host_count": None if vhosts is None else len(vhosts),
            "connection_count": totals.get("connections", 0),
            "queue_count": totals.get("queues", 0),
        },
        "uptime": int(overview.get("uptime", 0)) // 1000,
        "vm_memory_calculation_strategy": node.get("mem_calculation_strategy", "rss"),
        "vm_memory_high_watermark_limit": node.get("mem_limit"),
        "vm_memory_high_watermark_setting": {"absolute": node.get("mem_limit")},
    }


def _optional(api: Api, path: str) -> Any:
    """What a user without the monitoring tag may not read is left out, not an error."""
    try:
        return api.get(path)
    except HttpError as exc:
        if exc.status in (401, 403, 404):
            return None
        raise


@command("await_startup", "wait until the broker has started (up to --timeout, default 300 s)")
def await_startup(api: Api, args: argparse.Namespace, out: Output) -> None:
    """rabbitmqctl await_startup: quiet, 0 once the node runs; 69 if it does not within the
    timeout. Refused credentials are an answer: no point waiting for them."""
    timeout = args.timeout if args.timeout_given else 300.0
    deadline = time.monotonic() + timeout
    api.timeout = min(api.timeout, 5.0)
    while True:
        try:
            api.get("overview")
            return
        except HttpError as exc:
            if exc.status in (401, 403):
                raise
            error: CtlError = exc
        except CtlError as exc:  # nothing listening yet
            error = exc
        if time.monotonic() >= deadline:
            raise CtlError(f"Warren did not start within {timeout:g} seconds: {error}",
                           EX_UNAVAILABLE)  # fmt: skip
        time.sleep(0.2)


@command("ping", "check that the broker answers (and that the credentials work)")
def ping(api: Api, args: argparse.Namespace, out: Output) -> None:
    overview = api.get("overview")
    out.info(f"Will ping {overview.get('node')}.")
    if not out.json:
        print("Ping succeeded")
    else:
        out.document({"result": "ok", "node": overview.get("node")})


def _policy_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--priority", type=int, default=0)
    p.add_argument(
        "--apply-to",
        default="all",
        choices=["queues", "classic_queues", "quorum_queues", "streams", "exchanges", "all"],
    )
    p.add_argument("name")
    p.add_argument("pattern")
    p.add_argument("definition", help="a JSON object")


@command("set_policy", "set a policy", _policy_args)
def set_policy(api: Api, args: argparse.Namespace, out: Output) -> None:
    out.info(
        f'Setting policy "{args.name}" for pattern "{args.pattern}" to "{args.definition}" '
        f'with priority "{args.priority}" for vhost "{args.vhost}" ...'
    )
    try:
        definition = json.loads(args.definition)
    except ValueError:
        raise CtlError("JSON decoding error. Reason: badarg", EX_UNAVAILABLE) from None
    body = {
        "pattern": args.pattern,
        "definition": definition,
        "priority": args.priority,
        "apply-to": args.apply_to,
    }
    try:
        _vhost_call(
            args.vhost,
            lambda: api.request("PUT", f"policies/{q(args.vhost)}/{q(args.name)}", body),
        )
    except HttpError as exc:
        if exc.status == 400:  # rabbitmqctl: a definition the node refuses exits 69
            raise CtlError(str(exc), EX_UNAVAILABLE) from None
        raise


def _vhost_call(vhost: str, fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except HttpError as exc:
        if exc.status == 404 and "vhost" in str(exc):
            raise _no_vhost(vhost) from None
        raise


@command("clear_policy", "remove a policy", lambda p: p.add_argument("name"))
def clear_policy(api: Api, args: argparse.Namespace, out: Output) -> None:
    out.info(f'Clearing policy "{args.name}" on vhost "{args.vhost}" ...')
    try:
        api.request("DELETE", f"policies/{q(args.vhost)}/{q(args.name)}")
    except HttpError as exc:
        if exc.status == 404:
            raise CtlError("Parameter does not exist", EX_UNAVAILABLE) from None
        raise


@command("trace_on", "record what happens to every message in a vhost (see warren-report)")
def trace_on(api: Api, args: argparse.Namespace, out: Output) -> None:
    out.info(f'Starting tracing for vhost "{args.vhost}" ...')
    _trace_call(api, "PUT", args.vhost)


@command("trace_off", "stop recording the message lifecycle of a vhost")
def trace_off(api: Api, args: argparse.Namespace, out: Output) -> None:
    out.info(f'Stopping tracing for vhost "{args.vhost}" ...')
    _trace_call(api, "DELETE", args.vhost)


def _trace_call(api: Api, method: str, vhost: str) -> None:
    try:
        api.request(method, f"trace/{q(vhost)}")
    except HttpError as exc:
        if exc.status == 404:
            raise _no_vhost(vhost) from None
        raise


def _two(first: str, second: str) -> Callable[[argparse.ArgumentParser], object]:
    def add(p: argparse.ArgumentParser) -> None:
        p.add_argument(first)
        p.add_argument(second)

    return add


def _add_user_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("username")
    p.add_argument("password", nargs="?", help="default: read from standard input")


@command("add_user", "add a user (no tags, no permissions)", _add_user_args)
def add_user(api: Api, args: argparse.Namespace, out: Output) -> None:
    out.info(f'Adding user "{args.username}" ...')
    if args.password is None:  # rabbitmqctl reads it from standard input, one line
        if not out.quiet:
            print("Password: ")
        line = sys.stdin.readline().rstrip("\n")
        if not line:
            raise CtlError("Password is not provided via argument or stdin", EX_DATAERR)
        args.password = line
    try:
        api.get(f"users/{q(args.username)}")
    except HttpError as exc:
        if exc.status != 404:
            raise
    else:
        raise CtlError(f'User "{args.username}" already exists', EX_SOFTWARE)
    api.request("PUT", f"users/{q(args.username)}", {"password": args.password, "tags": ""})
    out.info(
        "Done. Don't forget to grant the user permissions to some virtual hosts! "
        "See 'warrenctl help set_permissions' to learn more."
    )


@command("delete_user", "delete a user", lambda p: p.add_argument("username"))
def delete_user(api: Api, args: argparse.Namespace, out: Output) -> None:
    out.info(f'Deleting user "{args.username}" ...')
    _user_call(api, args.username, lambda: api.request("DELETE", f"users/{q(args.username)}"))


@command("change_password", "change a user's password", _two("username", "new_password"))
def change_password(api: Api, args: argparse.Namespace, out: Output) -> None:
    out.info(f'Changing password for user "{args.username}" ...')
    user = _user(api, args.username)
    body = {"password": args.new_password, "tags": user.get("tags", [])}
    api.request("PUT", f"users/{q(args.username)}", body)


def _tags_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("username")
    p.add_argument("tags", nargs="*", metavar="tag")


@command("set_user_tags", "replace a user's tags (none clears them)", _tags_args)
def set_user_tags(api: Api, args: argparse.Namespace, out: Output) -> None:
    out.info(f'Setting tags for user "{args.username}" to [{", ".join(args.tags)}] ...')
    user = _user(api, args.username)
    # the API replaces the whole user: keep its password by sending the hash back
    body = {
        "password_hash": user.get("password_hash", ""),
        "hashing_algorithm": user.get("hashing_algorithm"),
        "tags": args.tags,
    }
    api.request("PUT", f"users/{q(args.username)}", body)


def _vhost_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("vhost_name", metavar="vhost")
    p.add_argument("--description", default=None)
    p.add_argument("--tags", default=None, help="comma-separated")
    p.add_argument("--default-queue-type", default=None, choices=["classic", "quorum", "stream"])


@command("add_vhost", "add a virtual host", _vhost_args)
def add_vhost(api: Api, args: argparse.Namespace, out: Output) -> None:
    out.info(f'Adding vhost "{args.vhost_name}" ...')
    body: dict[str, Any] = {}
    if args.description is not None:
        body["description"] = args.description
    if args.tags is not None:
        body["tags"] = args.tags
    if args.default_queue_type is not None:
        body["default_queue_type"] = args.default_queue_type
    api.request("PUT", f"vhosts/{q(args.vhost_name)}", body)


@command(
    "delete_vhost",
    "delete a virtual host and everything in it",
    lambda p: p.add_argument("vhost_name", metavar="vhost"),
)
def delete_vhost(api: Api, args: argparse.Namespace, out: Output) -> None:
    out.info(f'Deleting vhost "{args.vhost_name}" ...')
    try:
        api.request("DELETE", f"vhosts/{q(args.vhost_name)}")
    except HttpError as exc:
        if exc.status == 404:
            raise _no_vhost(args.vhost_name, bare=True) from None
        raise


def _permission_args(p: argparse.ArgumentParser) -> None:
    for name in ("username", "conf", "write", "read"):
        p.add_argument(name)


@command("set_permissions", "set a user's permissions in a vhost", _permission_args)
def set_permissions(api: Api, args: argparse.Namespace, out: Output) -> None:
    out.info(f'Setting permissions for user "{args.username}" in vhost "{args.vhost}" ...')
    body = {"configure": args.conf, "write": args.write, "read": args.read}
    try:
        api.request("PUT", f"permissions/{q(args.vhost)}/{q(args.username)}", body)
    except HttpError as exc:
        if exc.status in (400, 404):
            raise _permission_target_missing(api, args) from None
        raise


def _permission_target_missing(api: Api, args: argparse.Namespace) -> CtlError:
    """Which of the two is missing, worded as rabbitmqctl words it: the vhost first."""
    try:
        api.get(f"vhosts/{q(args.vhost)}")
    except HttpError as exc:
        if exc.status == 404:
            return _no_vhost(args.vhost)
        raise
    return CtlError(f"User {args.username} does not exist", EX_NOUSER)


@command(
    "clear_permissions",
    "remove a user's permissions in a vhost",
    lambda p: p.add_argument("username"),
)
def clear_permissions(api: Api, args: argparse.Namespace, out: Output) -> None:
    out.info(f'Clearing permissions for user "{args.username}" in vhost "{args.vhost}" ...')
    try:
        api.request("DELETE", f"permissions/{q(args.vhost)}/{q(args.username)}")
    except HttpError as exc:
        if exc.status != 404:
            raise
        try:
            api.get(f"users/{q(args.username)}")
        except HttpError as missing:
            if missing.status != 404:
                raise
        else:  # rabbitmqctl: clearing permissions a user does not have succeeds
            try:
                api.get(f"vhosts/{q(args.vhost)}")
            except HttpError:
                raise _no_vhost(args.vhost) from None
            return
        raise _permission_target_missing(api, args) from None


def _queue_missing(args: argparse.Namespace) -> CtlError:
    return CtlError("not_found", EX_UNAVAILABLE)


@command("purge_queue", "remove a queue's ready messages", lambda p: p.add_argument("queue"))
def purge_queue(api: Api, args: argparse.Namespace, out: Output) -> None:
    out.info(f"Purging queue '{args.queue}' in vhost '{args.vhost}' ...")
    try:
        api.request("DELETE", f"queues/{q(args.vhost)}/{q(args.queue)}/contents")
    except HttpError as exc:
        if exc.status == 404:
            raise _queue_missing(args) from None
        raise


def _browse_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("queue")
    p.add_argument("--offset", type=int, default=0, help="the first position listed")
    p.add_argument("--count", type=int, default=20, help="how many messages at most")
    p.add_argument(
        "--search", help="only those whose message id, correlation id or a header has it"
    )


@command("browse_queue", "list a queue's ready messages without taking them", _browse_args)
def browse_queue(api: Api, args: argparse.Namespace, out: Output) -> None:
    out.info(f"Browsing queue '{args.queue}' in vhost '{args.vhost}' ...")
    path = f"queues/{q(args.vhost)}/{q(args.queue)}/messages"
    try:
        query = f"offset={args.offset}&count={args.count}"
        if args.search:
            query += "&search=" + q(args.search)
        rows = api.get(f"{path}?{query}")
    except HttpError as exc:
        if exc.status == 404:
            raise _queue_missing(args) from None
        raise
    columns = ["position", "seq", "redelivered", "delivery_count", "message_id"]
    columns += ["payload_encoding", "payload"]
    out.rows(rows, columns, {"message_id": "properties.message_id"})


def _one_message_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("queue")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--position", type=int, help="the message at this position (browse_queue)")
    which.add_argument("--seq", type=int, help="the message with this seq (browse_queue)")
    which.add_argument("--message-id", help="the oldest ready message with this message id")


def _chosen(args: argparse.Namespace) -> dict[str, Any]:
    for key in ("position", "seq", "message_id"):
        value = getattr(args, key)
        if value is not None:
            return {key: value}
    raise CtlError("Choose the message with --position, --seq or --message-id", EX_USAGE)


def _act(api: Api, args: argparse.Namespace, action: str, body: dict[str, Any]) -> Any:
    path = f"queues/{q(args.vhost)}/{q(args.queue)}/messages/{action}"
    try:
        return api.request("POST", path, {**_chosen(args), **body})
    except HttpError as exc:
        if exc.status == 404 and "no " not in str(exc):
            raise _queue_missing(args) from None
        raise


@command("delete_message", "remove one ready message from a queue", _one_message_args)
def delete_message(api: Api, args: argparse.Namespace, out: Output) -> None:
    out.info(f"Deleting a message of queue '{args.queue}' in vhost '{args.vhost}' ...")
    out.document(_act(api, args, "delete", {}))


def _move_args(p: argparse.ArgumentParser) -> None:
    _one_message_args(p)
    to = p.add_mutually_exclusive_group(required=True)
    to.add_argument("--to-queue", help="into this queue, as it is")
    to.add_argument("--to-exchange", help="published to this exchange")
    p.add_argument("--routing-key", help="with --to-exchange (default: the message's own)")


@command("move_message", "move one ready message to another queue or exchange", _move_args)
def move_message(api: Api, args: argparse.Namespace, out: Output) -> None:
    out.info(f"Moving a message of queue '{args.queue}' in vhost '{args.vhost}' ...")
    body: dict[str, Any] = {}
    if args.to_queue is not None:
        body["queue"] = args.to_queue
    else:
        body["exchange"] = args.to_exchange
        if args.routing_key is not None:
            body["routing_key"] = args.routing_key
    out.document(_act(api, args, "move", body))


@command("message_to_tail", "send one ready message to the back of its queue", _one_message_args)
def message_to_tail(api: Api, args: argparse.Namespace, out: Output) -> None:
    out.info(f"Sending a message of queue '{args.queue}' in vhost '{args.vhost}' to its tail ...")
    out.document(_act(api, args, "to-tail", {}))


def _replay_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("queue")
    p.add_argument("--count", type=int, help="only the first COUNT messages (default: all)")
    p.add_argument("--keep-x-death", action="store_true", help="keep the x-death headers")


@command("replay_dead_letters", "republish dead letters to where they died", _replay_args)
def replay_dead_letters(api: Api, args: argparse.Namespace, out: Output) -> None:
    out.info(f"Replaying dead letters of queue '{args.queue}' in vhost '{args.vhost}' ...")
    body: dict[str, Any] = {"keep_x_death": args.keep_x_death}
    if args.count is not None:
        body["count"] = args.count
    try:
        result = api.request("POST", f"queues/{q(args.vhost)}/{q(args.queue)}/replay", body)
    except HttpError as exc:
        if exc.status == 404:
            raise _queue_missing(args) from None
        raise
    out.document(result)


def _delete_queue_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("queue")
    p.add_argument("-e", "--if-empty", action="store_true", help="only if it has no messages")
    p.add_argument("-u", "--if-unused", action="store_true", help="only if it has no consumers")


@command("delete_queue", "delete a queue", _delete_queue_args)
def delete_queue(api: Api, args: argparse.Namespace, out: Output) -> None:
    out.info(f"Deleting queue '{args.queue}' on vhost '{args.vhost}' ...")
    path = f"queues/{q(args.vhost)}/{q(args.queue)}"
    try:
        ready = api.get(path + "?columns=messages_ready").get("messages_ready", 0)
        flags = [f for f, on in (("if-empty", args.if_empty), ("if-unused", args.if_unused)) if on]
        api.request("DELETE", path + ("?" + "&".join(f + "=true" for f in flags) if flags else ""))
    except HttpError as exc:
        if exc.status == 404:  # rabbitmqctl: this one is 64, purge_queue's is 69
            raise CtlError("Queue not found", EX_USAGE) from None
        raise
    out.info(f"Queue was successfully deleted with {ready} ready messages")


# ---- shovels (rabbitmq_shovel's CLI commands: ShovelStatusCommand, DeleteShovelCommand,
# RestartShovelCommand), over /api/shovels and the shovel parameters ----

SHOVEL_COLUMNS = ["name", "vhost", "type", "state", "source", "destination", "last_changed"]
# the API row's fields under the names shovel_status shows them (fmt_status/2, details_to_map/1)
SHOVEL_FIELDS = {
    "source": "src_uri", "destination": "dest_uri", "source_protocol": "src_protocol",
    "destination_protocol": "dest_protocol", "termination_reason": "reason",
    "last_changed": "timestamp", "source_queue": "src_queue", "source_exchange": "src_exchange",
    "source_exchange_key": "src_exchange_key", "destination_queue": "dest_queue",
    "destination_exchange": "dest_exchange", "destination_exchange_key": "dest_exchange_key",
}  # fmt: skip


@command("shovel_status", "list the dynamic shovels and their state", _columns_arg(SHOVEL_COLUMNS))
def shovel_status(api: Api, args: argparse.Namespace, out: Output) -> None:
    out.info(f"Shovel status on node {api.get('overview').get('node')}")
    items = []
    for row in api.get("shovels"):
        item = dict(row)
        for name, field in SHOVEL_FIELDS.items():
            item[name] = row.get(field, "")
        items.append(item)
    out.rows(items, args.columns or args.default_columns, {})


def _shovel_missing(api: Api, args: argparse.Namespace, text: str) -> CtlError:
    node = api.get("overview").get("node")
    return CtlError(text.format(node=node, vhost=args.vhost), EX_SOFTWARE)


@command("delete_shovel", "delete a dynamic shovel", lambda p: p.add_argument("name"))
def delete_shovel(api: Api, args: argparse.Namespace, out: Output) -> None:
    out.info(f"Deleting shovel {args.name} in vhost {args.vhost}")
    running = any(
        r.get("name") == args.name and r.get("vhost") == args.vhost for r in api.get("shovels")
    )
    # its parameter goes in any case, as rabbitmqctl's try_force_removing/4 does
    api.request("DELETE", f"shovels/vhost/{q(args.vhost)}/{q(args.name)}")
    if not running:
        raise _shovel_missing(
            api,
            args,
            "Shovel with the given name was not found on the target node '{node}' and/or "
            "virtual host '{vhost}'. It may be failing to connect and report its state, will "
            "delete its runtime parameter...",
        )


@command("restart_shovel", "restart a dynamic shovel", lambda p: p.add_argument("name"))
def restart_shovel(api: Api, args: argparse.Namespace, out: Output) -> None:
    node = api.get("overview").get("node")
    out.info(f"Restarting dynamic Shovel {args.name} in virtual host {args.vhost} on node {node}")
    try:
        api.request("DELETE", f"shovels/vhost/{q(args.vhost)}/{q(args.name)}/restart")
    except HttpError as exc:
        if exc.status == 404:
            raise _shovel_missing(
                api,
                args,
                "Shovel with the given name was not found on the target node '{node}' and / "
                "or virtual host '{vhost}'",
            ) from None
        raise


def _close_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("connection", help="its name, as list_connections name shows it")
    p.add_argument("explanation")


@command("close_connection", "close a client connection", _close_args)
def close_connection(api: Api, args: argparse.Namespace, out: Output) -> None:
    out.info(f"Closing connection {args.connection}, reason: {args.explanation}...")
    try:
        api.request(
            "DELETE", f"connections/{q(args.connection)}", headers={"X-Reason": args.explanation}
        )
    except HttpError as exc:
        if exc.status == 404:
            raise CtlError(f"no connection named '{args.connection}'", EX_UNAVAILABLE) from None
        raise


@command(
    "export_definitions",
    "write users, vhosts, permissions, policies, queues, exchanges and bindings as JSON",
    lambda p: p.add_argument("path", help="a file, or - for standard output"),
)
def export_definitions(api: Api, args: argparse.Namespace, out: Output) -> None:
    definitions = api.get("definitions")
    text = json.dumps(definitions, indent=2) + "\n"
    if args.path == "-":
        sys.stdout.write(text)
        return
    out.info(f'Exporting definitions in JSON to a file at "{args.path}" ...')
    try:
        with open(args.path, "w", encoding="utf-8") as fh:
            fh.write(text)
    except OSError as exc:
        raise CtlError(f"cannot write {args.path}: {exc.strerror}", EX_SOFTWARE) from None


@command(
    "import_definitions",
    "import a definitions file (RabbitMQ's JSON format)",
    lambda p: p.add_argument(
        "path", nargs="?", default="-", help="a file, or - for standard input"
    ),
)
def import_definitions(api: Api, args: argparse.Namespace, out: Output) -> None:
    if args.path != "-" and not os.path.isfile(args.path):  # checked first, as rabbitmqctl
        raise CtlError(
            f"(argument validation): Bad argument: File {args.path} does not exist", EX_DATAERR
        )
    where = "standard input" if args.path == "-" else f'a file at "{args.path}"'
    out.info(f"Importing definitions in JSON from {where} ...")
    try:
        if args.path == "-":
            text = sys.stdin.read()
        else:
            with open(args.path, encoding="utf-8") as fh:
                text = fh.read()
    except OSError as exc:
        raise CtlError(f"cannot read {args.path}: {exc.strerror}", EX_DATAERR) from None
    try:
        definitions = json.loads(text)
    except ValueError as exc:
        raise CtlError(f"{args.path} is not valid JSON: {exc}", EX_DATAERR) from None
    api.request("POST", "definitions", definitions)
    out.info("Successfully imported definitions.")


# ---- the command line ----


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise CtlError(f"(argument validation): {message}", EX_USAGE)


def _common(parser: argparse.ArgumentParser, defaults: bool) -> None:
    """Options allowed before and after the verb, as rabbitmqctl's are."""
    sup = None if defaults else argparse.SUPPRESS

    def d(value: Any) -> Any:
        return value if defaults else sup

    parser.add_argument(
        "--url", default=d(None), help="management API, e.g. http://user:pass@host:15672"
    )
    parser.add_argument(
        "--username",
        dest="api_user",
        metavar="USER",
        default=d(None),
        help="default: the config's default_user",
    )
    parser.add_argument(
        "--password",
        dest="api_password",
        metavar="PASSWORD",
        default=d(None),
        help="default: its default_pass",
    )
    parser.add_argument("--config", default=d(None), help="rabbitmq.conf to read defaults from")
    parser.add_argument(
        "--data-dir",
        default=d(None),
        help="a running Warren's data dir, to find its management port "
        "(default: $WARREN_DATA_DIR, else the config's)",
    )
    parser.add_argument("-p", "--vhost", default=d("/"), help="virtual host (default /)")
    parser.add_argument("--formatter", choices=["table", "json"], default=d("table"))
    parser.add_argument("-q", "--quiet", action="store_true", default=d(False))
    parser.add_argument("-s", "--silent", action="store_true", default=d(False))
    parser.add_argument("--no-table-headers", action="store_true", default=d(False))
    parser.add_argument("-t", "--timeout", type=float, default=d(None), help="seconds (60)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="warrenctl",
        description="Manage Warren through its management API (rabbitmqctl's commands).",
    )
    _common(parser, defaults=True)
    sub = parser.add_subparsers(dest="command", metavar="command", parser_class=_Parser)
    for name, (_, help_text, arguments) in sorted(COMMANDS.items()):
        p = sub.add_parser(name, help=help_text, description=help_text)
        _common(p, defaults=False)
        arguments(p)
    sub.add_parser("help", help="show a command's usage").add_argument("verb", nargs="?")
    return parser


def _connection(args: argparse.Namespace) -> Api:
    """--url and credentials, else the local config's management port and default user."""
    url, user, password = args.url, args.api_user, args.api_password
    if url is None or user is None or password is None:
        from warren.config import ConfigError, load_settings

        try:
            settings = load_settings(args.config)
        except ConfigError as exc:
            raise CtlError(f"configuration error: {exc}", EX_USAGE) from None
        source = "--url"
        if url is None:
            url, source = _local_url(settings, args)
        user = settings.default_user if user is None else user
        password = settings.default_pass if password is None else password
        api = Api(url, user, password, args.timeout)
        api.source = source
        return api
    return Api(url, user, password, args.timeout)


def _local_url(settings: Any, args: argparse.Namespace) -> tuple[str, str]:
    """The management API of the Warren running on this machine, and how it was found:
    the endpoints file a running warren-server keeps in its data dir (it knows a port
    given on the command line, or 0), else the configuration's management.tcp.port."""
    import os

    data_dir = args.data_dir or os.environ.get("WARREN_DATA_DIR") or settings.data_dir
    if data_dir:
        path = os.path.join(data_dir, ENDPOINTS_FILE)
        running = _running_endpoints(path)
        if running is not None:
            return running["management"], f"from {path}, pid {running['pid']}"
    if settings.management_port is None:
        raise CtlError("the management API is disabled in the configuration; use --url")
    host = settings.management_ip
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    host = f"[{host}]" if ":" in host else host
    files = settings.config_files
    where = f"management.tcp.port in {files[0]}" if files else "the default port, no config file"
    return f"http://{host}:{settings.management_port}", where


def _running_endpoints(path: str) -> dict[str, Any] | None:
    import os

    try:
        with open(path, encoding="utf-8") as fh:
            endpoints = json.load(fh)
        os.kill(int(endpoints["pid"]), 0)  # a file left by a broker that died is ignored
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return endpoints if isinstance(endpoints.get("management"), str) else None


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help()
            return EX_USAGE
        if args.command == "help":  # rabbitmqctl help [verb]
            verb = args.verb
            if verb is None:
                parser.print_help()
            elif verb in COMMANDS:
                parser.parse_args([verb, "--help"])  # prints and exits 0
            else:
                raise CtlError(f"(argument validation): no command '{verb}'", EX_USAGE)
            return 0
        args.timeout_given = args.timeout is not None
        if args.timeout is None:
            args.timeout = 60.0
        fn = COMMANDS[args.command][0]
        api = _connection(args)
        fn(api, args, Output(args))
    except HttpError as exc:
        if exc.status == 401:  # perhaps not Warren at all: say whom we asked
            print(f"Error:\nnot authorised by {api.base} ({api.source}): {exc}", file=sys.stderr)
        else:
            print(f"Error:\n{exc}", file=sys.stderr)
        return exc.code
    except CtlError as exc:
        text = str(exc)
        if exc.bare:
            print(text, file=sys.stderr)
        elif text.startswith("("):  # "Error (argument validation): ...", on one line
            print(f"Error {text}", file=sys.stderr)
        else:
            print(f"Error:\n{text}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
