"""Cross-site requests cannot drive the management API.

A page on another origin can make a browser send a POST as a form (text/plain, urlencoded,
multipart) or as a bodiless fetch, with no CORS preflight, and the browser attaches the basic
credentials it has for the API. The API answers those 415 before it reads the body, and its
preflight answers carry no Access-Control-Allow-* headers, so a script cannot send JSON
cross-origin either. RabbitMQ refuses such bodies with 415 on /api/definitions
(rabbit_mgmt_wm_definitions:content_types_accepted, 4.3); Warren refuses them on every route.
"""

from __future__ import annotations

import http.client
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from playwright.sync_api import sync_playwright

from tests.http_api import HttpApi
from tests.test_console import CHROMIUM, CHROMIUM_ARGS
from warren.broker.testkit import RunningBroker, run_broker

ADMIN = '{"users":[{"name":"mallory","password":"pw","tags":"administrator"}]}'


@pytest.fixture(scope="module")
def warren() -> Iterator[RunningBroker]:
    with run_broker(management_port=0) as running:
        yield running


@pytest.fixture(scope="module")
def api(warren: RunningBroker) -> HttpApi:
    assert warren.server.management_port
    return HttpApi(warren.server.management_port)


def send(
    api: HttpApi, method: str, path: str, body: bytes | None, headers: dict[str, str]
) -> tuple[int, bytes, dict[str, str]]:
    """A raw request: exactly these headers, no Content-Type unless given."""
    host = api.base.removeprefix("http://")
    conn = http.client.HTTPConnection(host, timeout=10)
    auth = {"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="}  # guest:guest
    conn.request(method, path, body=body, headers={**auth, **headers})
    resp = conn.getresponse()
    payload = resp.read()
    conn.close()
    return resp.status, payload, {k.lower(): v for k, v in resp.getheaders()}


def users(api: HttpApi) -> set[str]:
    return {u["name"] for u in api.request("GET", "/api/users").body}


@pytest.mark.parametrize(
    "content_type",
    [
        "text/plain",
        "text/plain;charset=UTF-8",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=xyz",
        None,
    ],
)
def test_a_post_that_is_not_json_is_refused_and_changes_nothing(
    api: HttpApi, content_type: str | None
) -> None:
    headers = {} if content_type is None else {"Content-Type": content_type}
    status, body, _ = send(api, "POST", "/api/definitions", ADMIN.encode(), headers)
    assert status == 415, body
    assert b"application/json" in body
    assert "mallory" not in users(api)


def test_a_bodiless_post_is_refused(api: HttpApi) -> None:
    # what fetch(url, {method: "POST", mode: "no-cors"}) sends: no body, no Content-Type
    api.ok("PUT", "/api/queues/%2F/csrf-q", {"durable": True})
    status, _, _ = send(api, "POST", "/api/bindings/%2F/e/amq.direct/q/csrf-q", None, {})
    assert status == 415
    bindings = api.request("GET", "/api/queues/%2F/csrf-q/bindings").body
    assert [b["source"] for b in bindings] == [""]  # the default binding only


def test_json_with_parameters_is_accepted(api: HttpApi) -> None:
    headers = {"Content-Type": "Application/JSON; charset=utf-8"}
    status, _, _ = send(api, "PUT", "/api/vhosts/csrf-json", b"{}", headers)
    assert status == 201


def test_a_put_body_must_be_json_but_a_bodiless_put_stays_accepted(api: HttpApi) -> None:
    status, _, _ = send(api, "PUT", "/api/vhosts/csrf-text", b"{}", {"Content-Type": "text/plain"})
    assert status == 415
    assert "csrf-text" not in {v["name"] for v in api.request("GET", "/api/vhosts").body}
    # `curl -X PUT .../api/vhosts/x` sends neither body nor type; RabbitMQ creates the vhost
    status, _, _ = send(api, "PUT", "/api/vhosts/csrf-bare", None, {})
    assert status == 201


def test_authentication_is_checked_before_the_content_type(api: HttpApi) -> None:
    host = api.base.removeprefix("http://")
    conn = http.client.HTTPConnection(host, timeout=10)
    conn.request("POST", "/api/definitions", body=ADMIN, headers={"Content-Type": "text/plain"})
    assert conn.getresponse().status == 401  # as RabbitMQ: is_authorized before 415
    conn.close()


def test_preflight_grants_no_other_origin(api: HttpApi) -> None:
    status, _, headers = send(
        api,
        "OPTIONS",
        "/api/definitions",
        None,
        {"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"},
    )
    assert status == 200
    assert not [h for h in headers if h.startswith("access-control-")]


class _Attacker(BaseHTTPRequestHandler):
    """Another origin's page: a text/plain form that posts JSON-looking text to the API."""

    target = ""

    def do_GET(self) -> None:
        # name + "=" + value is the body of a text/plain form: {"users":[...],"x":"="}
        name = ADMIN[:-1] + ',"x":"'
        page = f"""<!doctype html><body>
<form id=f method=POST enctype=text/plain action="{self.target}/api/definitions">
<input type=hidden name='{name}' value='"}}'></form>
<script>document.getElementById("f").submit()</script></body>"""
        data = page.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


def test_a_cross_origin_form_in_chromium_cannot_create_an_administrator(api: HttpApi) -> None:
    _Attacker.target = api.base
    site = ThreadingHTTPServer(("127.0.0.1", 0), _Attacker)
    threading.Thread(target=site.serve_forever, daemon=True).start()
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(
                executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
            )
            # the browser holds the console's credentials and answers the API's challenge
            context = browser.new_context(
                http_credentials={"username": "guest", "password": "guest"}
            )
            page = context.new_page()
            # control: the credentials reach the API from this browser (a cross-origin GET)
            shown = page.goto(api.base + "/api/whoami")
            assert shown is not None and shown.status == 200
            with page.expect_response(lambda r: r.url.endswith("/api/definitions")) as posted:
                # "commit": a 204 (the attack working) would never fire "load"
                page.goto(f"http://127.0.0.1:{site.server_address[1]}/", wait_until="commit")
            status = posted.value.status
            assert posted.value.request.headers["content-type"].startswith("text/plain")
            browser.close()
    finally:
        site.shutdown()
    assert "mallory" not in users(api)
    assert status == 415
