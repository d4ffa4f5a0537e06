"""The web console end to end: Debian's chromium, driven by Playwright, against a real broker
filled by real AMQP clients. Every check waits for what the page shows (expect), never sleeps.

Screenshots go to a temporary directory, or to ``$WARREN_CONSOLE_SHOTS`` (``make
console-screenshots`` sets it to docs/, for docs/operating.md).
"""

from __future__ import annotations

import json
import os
import re
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pika
import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from tests.http_api import HttpApi, q
from warren.broker.testkit import RunningBroker, run_broker

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
POLL_MS = 400  # the console's refresh period in these tests (?refresh=)
SHOT_LIMIT = 200_000  # bytes: screenshots the docs embed stay small


@pytest.fixture(scope="module")
def warren() -> Iterator[RunningBroker]:
    with run_broker(management_port=0) as running:
        yield running


@pytest.fixture(scope="module")
def api(warren: RunningBroker) -> HttpApi:
    assert warren.server.management_port
    return HttpApi(warren.server.management_port)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = os.environ.get("WARREN_CONSOLE_SHOTS")
    path = Path(target) if target else tmp_path_factory.mktemp("console-shots")
    path.mkdir(parents=True, exist_ok=True)
    return path


PAGE_ERRORS: list[str] = []  # uncaught errors in any page's JavaScript


@pytest.fixture(autouse=True)
def no_script_errors() -> Iterator[None]:
    PAGE_ERRORS.clear()
    yield
    assert PAGE_ERRORS == []


def new_page(browser: Browser, **options: Any) -> Page:
    page = browser.new_page(**options)
    page.on("pageerror", lambda exc: PAGE_ERRORS.append(str(exc)))
    page.on("dialog", lambda dialog: dialog.accept())  # confirm() before purge, delete, close
    return page


def base(api: HttpApi) -> str:
    return api.base


def login(browser: Browser, api: HttpApi, user: str = "guest", password: str = "guest") -> Page:
    page = new_page(browser, viewport={"width": 1280, "height": 800})
    page.goto(f"{base(api)}/?refresh={POLL_MS}")
    page.fill("input[name=username]", user)
    page.fill("input[name=password]", password)
    page.click("form#login button[type=submit]")
    expect(page.locator("#who")).to_contain_text(user)
    return page


def screenshot(page: Page, path: Path) -> None:
    page.screenshot(path=str(path))
    assert 0 < path.stat().st_size < SHOT_LIMIT


def scroll_to(page: Page, selector: str) -> None:
    """The element at the top of the window (for a screenshot of that part of a page)."""
    page.locator(selector).evaluate(
        "el => window.scrollTo(0, el.getBoundingClientRect().top + window.scrollY - 56)"
    )


def amqp(warren: RunningBroker, name: str = "console-test") -> pika.BlockingConnection:
    params = pika.URLParameters(warren.url)
    params.client_properties = {"connection_name": name}
    return pika.BlockingConnection(params)


def stat(page: Page, key: str) -> str:
    return f"[data-stat={key}] b"


# ---- serving ----


def test_console_is_served_without_auth_and_the_api_keeps_its_own(api: HttpApi) -> None:
    with urllib.request.urlopen(base(api) + "/") as resp:
        assert resp.headers["Content-Type"].startswith("text/html")
        assert b'src="/console/app.js"' in resp.read()
    for name, kind in (("app.js", "text/javascript"), ("console.css", "text/css")):
        with urllib.request.urlopen(f"{base(api)}/console/{name}") as resp:
            assert resp.headers["Content-Type"].startswith(kind)
    for path in ("/console/missing.js", "/console/../app.py", "/elsewhere"):
        reply = api.request("GET", path, auth=False)
        assert (reply.status, reply.body) == (
            404,
            {"error": "Object Not Found", "reason": "Not Found"},
        )
    assert api.request("POST", "/", auth=False).status == 405
    assert api.request("GET", "/api/overview", auth=False).status == 401


def test_wrong_password_is_a_message_on_the_login_form(browser: Browser, api: HttpApi) -> None:
    page = new_page(browser)
    page.goto(base(api) + "/")
    page.fill("input[name=username]", "guest")
    page.fill("input[name=password]", "nope")
    page.click("form#login button[type=submit]")
    error = page.locator("#login [data-role=error]")
    expect(error).to_have_text("Login failed: wrong username or password.")
    page.close()


@pytest.mark.parametrize(
    "route",
    ["#/queus", "#/queues/orders", "#/queue/%2F", "#/queue/%2F/a/b", "#/nosuch/x/y"],
)
def test_a_mistyped_deep_link_says_not_found(browser: Browser, api: HttpApi, route: str) -> None:
    page = login(browser, api)
    page.goto(f"{base(api)}/?refresh={POLL_MS}{route}")
    expect(page.locator("[data-role=not-found] h1")).to_have_text("Not found")
    expect(page.locator("[data-role=not-found]")).to_contain_text(route)
    page.goto(f"{base(api)}/?refresh={POLL_MS}#/queues/")  # a trailing slash is no mistake
    expect(page.locator("main h1")).to_have_text("Queues")
    page.close()


def test_the_queue_heading_shows_its_name_at_heading_size(browser: Browser, api: HttpApi) -> None:
    api.ok("PUT", "/api/queues/%2F/console.heading", {"durable": True})
    page = login(browser, api)
    page.goto(f"{base(api)}/?refresh={POLL_MS}#/queue/%2F/console.heading")
    name = page.locator("main h1 [data-role=name]")
    expect(name).to_have_text("console.heading")
    sizes = page.evaluate(
        "() => { const h = document.querySelector('main h1');"
        " const n = h.querySelector('[data-role=name]');"
        " return [getComputedStyle(h).fontSize, getComputedStyle(n).fontSize]; }"
    )
    assert sizes[0] == sizes[1], sizes
    expect(page.locator("main h1")).to_contain_text("in vhost /")
    page.close()


# ---- queues: find, browse, publish, purge ----


def test_a_refresh_keeps_the_rows_it_shows_and_updates_their_cells(
    warren: RunningBroker, browser: Browser, api: HttpApi
) -> None:
    """The table polls every POLL_MS; a row already shown keeps its node (a click that spans
    a refresh is not lost), and a cell whose value changed is updated."""
    conn = amqp(warren)
    ch = conn.channel()
    ch.queue_declare("console.kept", durable=True)
    ch.queue_declare("console.not-kept", durable=True)  # for the filter to leave out
    ch.basic_publish("", "console.kept", b"1")
    page = login(browser, api)
    page.click("nav >> text=Queues")
    page.fill("input[type=search]", "console.kept$")
    page.check("text=regex")
    expect(page.locator(".pager")).to_contain_text(re.compile(r"· 1 of \d+"))
    row = page.locator("tbody tr[data-key='//console.kept']")
    ready = row.locator("td").nth(4)
    expect(ready).to_have_text("1")
    row.locator("a").evaluate("link => { link.kept = true }")  # a mark no re-render copies
    ch.basic_publish("", "console.kept", b"2")
    assert ch.queue_declare("console.kept", passive=True).method.message_count == 2
    expect(ready).to_have_text("2")
    assert row.locator("a").evaluate("link => link.kept === true")
    page.close()
    conn.close()


def test_find_a_filled_queue_browse_publish_and_purge(
    warren: RunningBroker, browser: Browser, api: HttpApi, shots: Path
) -> None:
    conn = amqp(warren)
    ch = conn.channel()
    ch.queue_declare("console.orders", durable=True)
    for n in (1, 2):
        ch.basic_publish(
            "",
            "console.orders",
            json.dumps({"order": n}).encode(),
            pika.BasicProperties(content_type="application/json", headers={"x-tenant": "acme"}),
        )
    for n in range(30):
        ch.queue_declare(f"console.idle.{n:02d}", durable=True)

    page = login(browser, api)
    page.click("nav >> text=Queues")
    page.click("th:text('Ready')")  # sorted on the server: the fullest queue comes first
    expect(page.locator("th:text('Ready')")).to_have_attribute("aria-sort", "descending")
    expect(page.locator("tbody tr").first).to_have_attribute("data-key", "//console.orders")
    page.fill("input[type=search]", "console.orders")
    row = page.locator("tbody tr[data-key='//console.orders']")
    expect(row).to_contain_text("2")
    # filtered on the server: "page 1 of 1 · 1 of 32" (unfiltered: "page 1 of 1 · 32")
    expect(page.locator(".pager")).to_contain_text(re.compile(r"· 1 of \d+"))
    screenshot(page, shots / "console-queues.png")
    row.locator("a").click()

    expect(page.locator(stat(page, "ready"))).to_have_text("2")
    messages = page.locator("[data-role=message]")  # browsed as the page opens
    expect(messages).to_have_count(2)
    expect(messages.nth(0).locator("[data-role=payload]")).to_have_text('{"order": 1}')
    expect(messages.nth(1).locator("[data-role=payload]")).to_have_text('{"order": 2}')
    props = messages.nth(0).locator("[data-role=properties]")
    expect(props).to_contain_text('"x-tenant": "acme"')
    expect(props).to_contain_text('"content_type": "application/json"')
    # nothing was taken, and the order is the publisher's
    after = api.ok("GET", "/api/queues/%2F/console.orders/messages")
    assert [(m["payload"], m["redelivered"]) for m in after] == [
        ('{"order": 1}', False),
        ('{"order": 2}', False),
    ]

    form = page.locator("form[data-role=publish]")
    form.locator("textarea[name=payload]").fill("from the console")
    form.locator("textarea[name=headers]").fill('{"x-source": "ui"}')
    form.locator("button[type=submit]").click()
    expect(form.locator(".msg")).to_contain_text("routed")
    expect(page.locator(stat(page, "ready"))).to_have_text("3")
    got = api.ok("POST", "/api/queues/%2F/console.orders/get", peek_body(5))
    assert got[2]["payload"] == "from the console"
    assert got[2]["properties"]["headers"] == {"x-source": "ui"}

    page.click("button:text('Purge')")
    expect(page.locator(stat(page, "ready"))).to_have_text("0")
    assert api.ok("GET", "/api/queues/%2F/console.orders")["messages_ready"] == 0
    conn.close()
    page.close()


def peek_body(count: int) -> dict[str, object]:
    return {"count": count, "ackmode": "ack_requeue_true", "encoding": "auto"}


def test_an_api_error_shows_next_to_the_action(
    warren: RunningBroker, browser: Browser, api: HttpApi
) -> None:
    api.ok("PUT", "/api/queues/%2F/console.bad-publish", {"durable": True})
    page = login(browser, api)
    page.goto(f"{base(api)}/?refresh={POLL_MS}#/queue/%2F/console.bad-publish")
    form = page.locator("form[data-role=publish]")
    form.locator("textarea[name=headers]").fill("not json")
    form.locator("button[type=submit]").click()
    expect(form.locator(".msg.error")).to_contain_text("Headers are not JSON")
    api.ok("DELETE", "/api/queues/%2F/console.bad-publish")
    # the queue went away under the page: the refresh error is a banner, the page stays
    expect(page.locator("#banner")).to_contain_text("404")
    expect(page.locator("h1")).to_contain_text("console.bad-publish")
    page.close()


def test_dead_letter_reason_shows_in_a_browsed_message(
    warren: RunningBroker, browser: Browser, api: HttpApi
) -> None:
    conn = amqp(warren)
    ch = conn.channel()
    ch.queue_declare("console.dlq", durable=True)
    ch.queue_declare(
        "console.work",
        arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "console.dlq"},
        durable=True,
    )
    ch.basic_publish("", "console.work", b"poison")
    method, _, _ = ch.basic_get("console.work")
    assert method is not None
    ch.basic_reject(method.delivery_tag, requeue=False)
    api.ok("GET", "/api/queues/%2F/console.dlq")
    page = login(browser, api)
    page.goto(f"{base(api)}/?refresh={POLL_MS}#/queue/%2F/console.dlq")
    expect(page.locator(stat(page, "ready"))).to_have_text("1")
    death = page.locator("[data-role=x-death]")
    expect(death).to_contain_text("rejected from queue console.work")
    page.goto(f"{base(api)}/?refresh={POLL_MS}#/queue/%2F/console.work")
    expect(page.locator(stat(page, "dead-lettered"))).to_have_text("rejected: 1")
    conn.close()
    page.close()


# ---- browse a queue, act on one message, replay dead letters (issue 40) ----


def test_browse_search_and_act_on_one_message(
    warren: RunningBroker, browser: Browser, api: HttpApi, shots: Path
) -> None:
    conn = amqp(warren)
    ch = conn.channel()
    ch.queue_declare("console.browse", durable=True)
    ch.queue_declare("console.browse.parked", durable=True)
    for n in range(25):
        props = pika.BasicProperties(
            message_id=f"order-{n}",
            correlation_id=f"batch-{n // 10}",
            headers={"tenant": "acme" if n % 2 else "globex"},
            content_type="application/json",
            delivery_mode=2,
        )
        ch.basic_publish("", "console.browse", json.dumps({"order": n}).encode(), props)
    ch.basic_publish("", "console.browse", b"<img src=x onerror=alert(1)>")
    page = login(browser, api)
    page.goto(f"{base(api)}/?refresh={POLL_MS}#/queue/%2F/console.browse")
    shown = page.locator("[data-role=message]")
    expect(shown).to_have_count(20)
    expect(page.locator("[data-role=browse-info]")).to_have_text("positions 0\u201319")
    page.click("button:text('Next')")
    expect(shown).to_have_count(6)
    hostile = shown.last.locator("[data-role=payload]")
    expect(hostile).to_have_text("<img src=x onerror=alert(1)>")  # text, not markup
    expect(page.locator("[data-role=messages] img")).to_have_count(0)
    page.click("button:text('Prev')")
    expect(shown.first).to_contain_text("#1")

    page.fill("input[name=search]", "order-7")
    page.click("button:text('Browse')")
    expect(shown).to_have_count(1)
    expect(shown.first).to_contain_text("#8")
    shown.first.locator("button:text('Delete')").click()
    expect(page.locator("[data-role=messages]")).to_contain_text("No ready message matches")
    page.fill("input[name=search]", "")
    page.click("button:text('Browse')")
    expect(shown.first.locator("[data-role=payload]")).to_have_text('{"order": 0}')
    shown.first.locator("button:text('To tail')").click()
    expect(shown.first.locator("[data-role=payload]")).to_have_text('{"order": 1}')
    move = shown.first.locator("form[data-role=move]")
    move.locator("input[name=target]").fill("console.browse.parked")
    move.locator("button:text('Move')").click()
    expect(shown.first.locator("[data-role=payload]")).to_have_text('{"order": 2}')
    # a message that left meanwhile: the API's 409 shows next to the button
    second = shown.nth(1)
    api.ok("POST", "/api/queues/%2F/console.browse/messages/delete", {"position": 1})
    second.locator("button:text('To tail')").click()
    expect(second.locator(".msg.error")).to_contain_text("409")
    page.click("button:text('Browse')")
    expect(shown).to_have_count(20)
    page.fill("input[name=search]", "acme")
    page.click("button:text('Browse')")
    expect(shown.first).to_contain_text("#3")  # order-5: order-1 went to parked, 3 was deleted
    scroll_to(page, "[data-role=browse-card]")
    screenshot(page, shots / "console-browse.png")

    after = api.ok("GET", "/api/queues/%2F/console.browse/messages?count=100")
    ids = [m["properties"].get("message_id") if m["properties"] else None for m in after]
    assert ids == [f"order-{n}" for n in (2, *range(4, 7), *range(8, 25))] + [None, "order-0"]
    parked = api.ok("GET", "/api/queues/%2F/console.browse.parked/messages")
    assert [m["properties"]["message_id"] for m in parked] == ["order-1"]
    conn.close()
    page.close()


def test_replay_dead_letters_from_the_queue_page(
    warren: RunningBroker, browser: Browser, api: HttpApi, shots: Path
) -> None:
    conn = amqp(warren)
    ch = conn.channel()
    ch.queue_declare("console.payments.dlq", durable=True)
    ch.queue_declare(
        "console.payments",
        durable=True,
        arguments={
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": "console.payments.dlq",
        },
    )
    for n in range(3):
        ch.basic_publish("", "console.payments", f"payment {n}".encode())
        method, _, _ = ch.basic_get("console.payments")
        assert method is not None
        ch.basic_reject(method.delivery_tag, requeue=False)
    ch.queue_declare("console.payments.dlq", passive=True)  # the rejects are done
    page = login(browser, api)
    page.goto(f"{base(api)}/?refresh={POLL_MS}#/queue/%2F/console.payments.dlq")
    expect(page.locator("[data-role=x-death]")).to_have_count(3)
    expect(page.locator("[data-role=x-death]").first).to_contain_text(
        "rejected from queue console.payments"
    )
    card = page.locator("[data-role=replay]")
    card.locator("input[name=replay_count]").fill("2")
    card.locator("button:text('Replay dead letters')").click()
    expect(card.locator(".msg")).to_contain_text(
        'Replayed 2 (2 to exchange "" with ["console.payments"])'
    )
    expect(page.locator("[data-role=message]")).to_have_count(1)
    expect(page.locator(stat(page, "ready"))).to_have_text("1")
    scroll_to(page, "[data-role=browse-card]")
    screenshot(page, shots / "console-replay.png")
    back = api.ok("GET", "/api/queues/%2F/console.payments/messages")
    assert [(m["payload"], m["x_death"]) for m in back] == [
        ("payment 0", None),
        ("payment 1", None),
    ]
    conn.close()
    page.close()


# ---- consumers in the timeout state ----


def test_a_consumer_entering_the_timeout_state(
    warren: RunningBroker, browser: Browser, api: HttpApi, shots: Path
) -> None:
    conn = amqp(warren, "slow-worker")
    ch = conn.channel()
    ch.queue_declare("console.slow", durable=True, arguments={"x-queue-type": "quorum"})
    ch.queue_declare("console.burst", durable=True)
    ch.basic_qos(prefetch_count=10)
    for n in range(3):
        ch.basic_publish("", "console.slow", f"job {n}".encode())
    ch.basic_consume(
        "console.slow",
        lambda *_: None,  # never acks
        consumer_tag="slow-worker",
        arguments={"x-consumer-timeout": 300},
    )
    page = login(browser, api)
    page.goto(f"{base(api)}/?refresh={POLL_MS}#/queue/%2F/console.slow")
    consumer = page.locator("tr[data-tag=slow-worker]")
    expect(consumer).to_contain_text("300 ms")
    expect(consumer.locator("[data-role=state]")).to_contain_text("timed out")
    expect(page.locator(stat(page, "timeouts"))).not_to_have_text("0")
    page.click("button:text('Browse')")  # the deliveries that timed out are ready again
    expect(page.locator("[data-role=message]").first).to_be_visible()
    page.evaluate("window.scrollTo(0, 0)")
    screenshot(page, shots / "console-queue.png")

    details = api.ok("GET", "/api/queues/%2F/console.slow")["consumer_details"]
    assert [(c["consumer_tag"], c["timed_out"]) for c in details] == [("slow-worker", True)]
    # rates: samples around bursts, as the broker's sampler takes them every few seconds
    rates = warren.server.management.rates
    warren.call(rates.sample)
    for burst in (50, 200, 120, 300):
        for n in range(burst):
            ch.basic_publish("", "console.burst", f"{n}".encode())
        ch.queue_declare("console.burst", passive=True)  # the burst is in
        warren.call(rates.sample)
    page.goto(f"{base(api)}/?refresh={POLL_MS}#/overview")
    publish_line = page.locator(".chart path").first
    four_or_more = re.compile(r"^M[^L]+(L[^L]+){3,}$")  # a point per rate between samples
    expect(publish_line).to_have_attribute("d", four_or_more)
    expect(page.locator(".chart .legend")).not_to_contain_text("publish 0.0/s")
    expect(page.locator("[data-role=stuck]")).to_contain_text("slow-worker on console.slow")
    screenshot(page, shots / "console-overview.png")
    conn.close()
    page.close()


def test_a_classic_consumer_holding_its_prefetch_shows_as_stuck(browser: Browser) -> None:
    # RabbitMQ 4.3's classic queues evaluate no consumer timeout (its release notes; the
    # x-consumer-timeout argument is quorum-only, rabbit_quorum_queue:capabilities/0), so a
    # consumer that never settles is shown, not cancelled: the age of its oldest unsettled
    # delivery (broker/ops/management/stuck.py), seen at each statistics sample
    with run_broker(management_port=0, clock="manual", consumer_stuck_after=30000) as running:
        assert running.server.management_port
        api = HttpApi(running.server.management_port)
        conn = amqp(running, "stuck-test")
        ch = conn.channel()
        ch.queue_declare("stuck.q", durable=True)
        ch.basic_qos(prefetch_count=2)
        for n in range(3):
            ch.basic_publish("", "stuck.q", f"job {n}".encode())
        tags: list[int] = []
        ch.basic_consume("stuck.q", lambda _c, m, _p, _b: tags.append(m.delivery_tag),
                         consumer_tag="holder")  # fmt: skip
        while len(tags) < 2:
            conn.process_data_events(time_limit=0.1)
        sample = running.server.management.rates.sample

        def holder() -> dict[str, Any]:
            (row,) = api.ok("GET", "/api/consumers")
            assert row["consumer_tag"] == "holder"
            return cast(dict[str, Any], row)

        running.call(sample)
        assert (holder()["oldest_unacked_ms"], holder()["stuck"]) == (0, False)
        running.clock.advance(20)
        running.call(sample)
        assert (holder()["oldest_unacked_ms"], holder()["stuck"]) == (20000, False)
        running.clock.advance(11)
        running.call(sample)
        row = holder()
        assert (row["oldest_unacked_ms"], row["stuck"]) == (31000, True)
        assert (row["messages_unacknowledged"], row["prefetch_count"]) == (2, 2)

        page = login(browser, api)
        page.goto(f"{base(api)}/?refresh={POLL_MS}#/overview")
        line = page.locator("[data-role=stuck] [data-stuck=holder]")
        expect(line).to_contain_text("holder on stuck.q")
        expect(line).to_contain_text("has waited 31 s and it holds its whole prefetch (2)")

        # settling the oldest: the next oldest has waited as long (it came in the same
        # sample); settling everything: nothing waits, nothing is stuck
        ch.basic_ack(tags[0])
        while len(tags) < 3:
            conn.process_data_events(time_limit=0.1)
        running.call(sample)
        assert holder()["stuck"] is True
        ch.basic_ack(tags[2], multiple=True)
        ch.queue_declare("stuck.q", durable=True, passive=True)  # the acks are in
        running.call(sample)
        assert (holder()["oldest_unacked_ms"], holder()["stuck"]) == (0, False)
        expect(page.locator("[data-role=stuck] [data-stuck=holder]")).to_have_count(0)
        page.close()
        conn.close()


# ---- exchanges ----


def test_an_exchange_shows_its_bindings_and_publishes(
    warren: RunningBroker, browser: Browser, api: HttpApi
) -> None:
    api.ok("PUT", "/api/exchanges/%2F/console.events", {"type": "fanout"})
    api.ok("PUT", "/api/queues/%2F/console.audit", {"durable": True})
    api.ok("POST", "/api/bindings/%2F/e/console.events/q/console.audit", {"routing_key": "all"})
    page = login(browser, api)
    page.click("nav >> text=Exchanges")
    page.fill("input[type=search]", "console.events")
    page.locator("tbody a", has_text="console.events").click()
    expect(page.locator("tbody")).to_contain_text("console.audit")
    form = page.locator("form[data-role=publish]")
    form.locator("input[name=routing_key]").fill("anything")
    form.locator("textarea[name=payload]").fill("audit me")
    form.locator("button[type=submit]").click()
    expect(form.locator(".msg")).to_contain_text("the message was routed")
    got = api.ok("POST", "/api/queues/%2F/console.audit/get", peek_body(1))
    assert [m["payload"] for m in got] == ["audit me"]
    page.close()


def test_a_delayed_exchange_shows_what_it_holds(
    warren: RunningBroker, browser: Browser, api: HttpApi
) -> None:
    arguments = {"x-delayed-type": "direct"}
    api.ok(
        "PUT",
        "/api/exchanges/%2F/console.later",
        {"type": "x-delayed-message", "arguments": arguments},
    )
    for _ in range(2):
        body = {"routing_key": "k", "payload": "x", "payload_encoding": "string",
                "properties": {"headers": {"x-delay": 600000}}}  # fmt: skip
        assert api.ok("POST", "/api/exchanges/%2F/console.later/publish", body) == {"routed": False}
    page = login(browser, api)
    page.goto(f"{base(api)}#/exchange/%2F/console.later")
    expect(page.locator(".card").first).to_contain_text("Messages delayed")
    expect(page.locator(".card").first).to_contain_text("2")
    page.close()
    api.ok("DELETE", "/api/exchanges/%2F/console.later")


# ---- policies ----


def test_policy_validation_add_edit_and_delete(
    warren: RunningBroker, browser: Browser, api: HttpApi
) -> None:
    api.ok("PUT", "/api/queues/%2F/console.policed", {"durable": True})
    page = login(browser, api)
    page.click("nav >> text=Policies")
    form = page.locator("form[data-role=policy-form]")
    form.locator("input[name=name]").fill("console-limits")
    form.locator("input[name=pattern]").fill("^console\\.policed$")
    form.locator("textarea[name=definition]").fill('{"max-length": "lots"}')
    form.locator("button[type=submit]").click()
    expect(form.locator(".msg.error")).to_contain_text("Validation failed")

    form.locator("textarea[name=definition]").fill('{"max-length": 5}')
    form.locator("button[type=submit]").click()
    row = page.locator("tr[data-policy=console-limits]")
    expect(row).to_contain_text('"max-length":5')
    assert api.ok("GET", "/api/queues/%2F/console.policed")["policy"] == "console-limits"

    row.locator("button:text('Edit')").click()
    form.locator("textarea[name=definition]").fill('{"max-length": 7}')
    form.locator("button[type=submit]").click()
    expect(row).to_contain_text('"max-length":7')
    page.goto(f"{base(api)}/?refresh={POLL_MS}#/queue/%2F/console.policed")
    expect(page.locator("[data-role=effective-policy]")).to_contain_text('"max-length": 7')

    page.click("nav >> text=Policies")
    page.locator("tr[data-policy=console-limits] button:text('Delete')").click()
    expect(page.locator("tr[data-policy=console-limits]")).to_have_count(0)
    assert api.ok("GET", f"/api/policies/%2F?name={q('console-limits')}") == []
    page.close()


# ---- connections and channels ----


def test_connections_show_the_client_and_close(
    warren: RunningBroker, browser: Browser, api: HttpApi
) -> None:
    conn = amqp(warren, "billing-service")
    conn.channel()
    page = login(browser, api)
    page.click("nav >> text=Connections")
    row = page.locator("tbody tr", has_text="billing-service")
    expect(row).to_contain_text("Pika Python Client Library")
    expect(row).to_contain_text("guest")
    page.click("nav >> text=Channels")
    expect(page.locator("tbody")).to_contain_text("guest")
    page.click("nav >> text=Connections")
    page.locator("tbody tr", has_text="billing-service").locator("button:text('Close')").click()
    expect(page.locator("tbody tr", has_text="billing-service")).to_have_count(0)
    with pytest.raises(pika.exceptions.ConnectionClosed) as closed:
        conn.process_data_events(time_limit=5)
        conn.channel()
    assert "Closed from the Warren console" in str(closed.value)
    page.close()


# ---- who may do what ----


def test_a_monitoring_user_sees_but_does_not_change(
    warren: RunningBroker, browser: Browser, api: HttpApi, shots: Path
) -> None:
    api.ok("PUT", "/api/users/console-watcher", {"password": "w", "tags": "monitoring"})
    nothing = {"configure": "", "write": "", "read": ""}
    api.ok("PUT", "/api/permissions/%2F/console-watcher", nothing)
    api.ok("PUT", "/api/queues/%2F/console.watched", {"durable": True})
    page = login(browser, api, "console-watcher", "w")
    expect(page.locator("nav a", has_text="Queues")).to_be_visible()
    expect(page.locator("nav a", has_text="Admin")).to_have_count(0)
    page.goto(f"{base(api)}/?refresh={POLL_MS}#/queue/%2F/console.watched")
    expect(page.locator(stat(page, "ready"))).to_have_text("0")
    expect(page.locator("form[data-role=publish]")).to_have_count(0)
    expect(page.locator("button:text('Purge')")).to_have_count(0)
    # the API, not the page, decides: a monitor's purge is refused
    reply = api.as_user("console-watcher", "w").request(
        "DELETE", "/api/queues/%2F/console.watched/contents"
    )
    assert reply.status == 401
    page.close()

    dark = new_page(browser, viewport={"width": 390, "height": 844}, color_scheme="dark")
    dark.goto(f"{base(api)}/?refresh={POLL_MS}")
    dark.fill("input[name=username]", "guest")
    dark.fill("input[name=password]", "guest")
    dark.click("form#login button[type=submit]")
    expect(dark.locator("#menu")).to_be_visible()  # a phone: the nav folds behind a button
    expect(dark.locator("nav")).to_be_hidden()
    dark.click("#menu")
    dark.click("nav >> text=Queues")
    expect(dark.locator("tbody tr").first).to_be_visible()
    background = dark.evaluate("getComputedStyle(document.body).backgroundColor")
    assert re.fullmatch(r"rgb\((\d+), (\d+), (\d+)\)", background)
    assert sum(int(x) for x in re.findall(r"\d+", background)) < 150  # dark
    screenshot(dark, shots / "console-phone-dark.png")
    dark.click("#theme")  # the toggle wins over the system's preference
    expect(dark.locator("html")).to_have_attribute("data-theme", "light")
    dark.close()


def test_an_administrator_manages_vhosts_and_permissions(browser: Browser, api: HttpApi) -> None:
    page = login(browser, api)
    page.click("nav >> text=Admin")
    vhost_form = page.locator("form", has_text="Add a vhost")
    vhost_form.locator("input[name=name]").fill("console-vh")
    vhost_form.locator("button[type=submit]").click()
    # the vhost, and its creator's full permissions there (as in RabbitMQ)
    expect(page.locator("tr", has_text="console-vh")).to_have_count(2)
    perm_form = page.locator("form", has_text="Set permissions")
    perm_form.locator("input[name=user]").fill("guest")
    perm_form.locator("input[name=vhost]").fill("console-vh")
    perm_form.locator("input[name=write]").fill("^$")
    perm_form.locator("button[type=submit]").click()
    expect(page.locator("tr", has_text="console-vh").filter(has_text="^$")).to_have_count(1)
    assert api.ok("GET", "/api/permissions/console-vh/guest")["write"] == "^$"
    perm_form.locator("input[name=user]").fill("nobody")
    perm_form.locator("button[type=submit]").click()
    expect(perm_form.locator(".msg.error")).to_contain_text("vhost_or_user_not_found")
    vhost_row = page.locator("tr:has(td:text-is('console-vh'))").first  # the vhosts table
    vhost_row.locator("button:text('Delete')").click()
    expect(page.locator("tr", has_text="console-vh")).to_have_count(0)
    assert api.get("/api/vhosts/console-vh").status == 404
    page.close()


def test_an_administrator_adds_a_plugin_exchange(
    warren: RunningBroker, browser: Browser, api: HttpApi
) -> None:
    """The exchange form offers the plugin types; the API's refusal shows next to the action."""
    page = login(browser, api)
    page.click("nav >> text=Exchanges")
    page.click("summary >> text=Add an exchange")
    form = page.locator("form[data-role=add-exchange]")
    form.locator("input[name=name]").fill("console.later")
    form.locator("select[name=xtype]").select_option("x-delayed-message")
    form.locator("button[type=submit]").click()
    expect(form.locator(".msg")).to_contain_text("x-delayed-type")  # the plugin's 406 text
    form.locator("textarea[name=arguments]").fill('{"x-delayed-type": "topic"}')
    form.locator("button[type=submit]").click()
    expect(form.locator(".msg")).to_contain_text("Exchange declared")
    made = api.ok("GET", "/api/exchanges/%2F/console.later")
    assert (made["type"], made["arguments"], made["durable"]) == (
        "x-delayed-message",
        {"x-delayed-type": "topic"},
        True,
    )
    expect(page.locator("tbody")).to_contain_text("console.later")
    page.close()
    api.ok("DELETE", "/api/exchanges/%2F/console.later")


# ---- streams ----


def test_a_stream_shows_as_rabbitmqs_management_ui_shows_it(
    warren: RunningBroker, browser: Browser, api: HttpApi, shots: Path
) -> None:
    """As rabbitmq_management's stream-queue-stats.ejs (4.3): the messages kept, consumers,
    segments and the oldest message; no get and no purge (global.js, QUEUE_TYPE["stream"]
    .actions); and each consumer's place in the log, which the API's readers give."""
    conn = amqp(warren)
    ch = conn.channel()
    ch.queue_declare(
        "console.events",
        durable=True,
        arguments={"x-queue-type": "stream", "x-stream-max-segment-size-bytes": 2000},
    )
    ch.confirm_delivery()
    for n in range(40):
        ch.basic_publish("", "console.events", b"event %02d " % n + b"." * 90)
    ch.basic_qos(prefetch_count=10)
    # from offset 5 with 10 credits and no acks: its next offset is 15
    ch.basic_consume(
        "console.events", lambda *a: None, arguments={"x-stream-offset": 5}, consumer_tag="reader-1"
    )
    # without a data directory a stream's log has a store of its own, whose fsync the
    # confirms do not wait for: its count reaches 40 when that store has written the chunks
    deadline = time.monotonic() + 30
    while (info := api.ok("GET", "/api/queues/%2F/console.events"))["messages"] < 40:
        assert time.monotonic() < deadline, info["messages"]
        conn.process_data_events(time_limit=0.05)
    assert info["type"] == "stream" and info["messages"] == 40 and info["segments"] > 1

    page = login(browser, api)
    page.click("nav >> text=Queues")
    page.fill("input[type=search]", "console.events")
    row = page.locator("tbody tr[data-key='//console.events']")
    expect(row).to_contain_text("stream")
    expect(row).to_contain_text("40")
    row.locator("a").click()
    expect(page.locator(stat(page, "messages"))).to_have_text("40")
    expect(page.locator(stat(page, "segments"))).to_have_text(str(info["segments"]))
    expect(page.locator(stat(page, "consumers"))).to_have_text("1")
    details = page.locator("dl.kv")
    expect(details).to_contain_text("Segments")
    expect(details).to_contain_text("Oldest message")
    reader = page.locator("tr[data-tag=reader-1]")
    expect(reader.locator("[data-role=offset]")).to_have_text("15")
    # browsed by offset, from the first one kept; nothing can be taken out of a stream
    shown = page.locator("[data-role=message]")
    expect(shown).to_have_count(20)
    expect(shown.first).to_contain_text("offset 0")
    expect(shown.first.locator("[data-role=payload]")).to_contain_text("event 00")
    expect(page.locator("button:text('To tail')")).to_have_count(0)
    page.click("button:text('Next')")
    expect(shown.first).to_contain_text("offset 20")
    expect(page.locator("button:text('Purge')")).to_be_hidden()
    expect(page.locator("button:text('Delete queue')")).to_be_visible()
    screenshot(page, shots / "console-stream.png")
    conn.close()
    page.close()
    api.ok("DELETE", "/api/queues/%2F/console.events")
