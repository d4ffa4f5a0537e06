"""The job's Parquet tables as one self-contained HTML page and a terminal summary.

Reads the tables with pyarrow (no Spark needed: ``warren-report --render OUT`` redraws a
report), draws the charts with matplotlib and embeds them as PNG data URIs.
"""

from __future__ import annotations

import base64
import datetime
import html
import io
import itertools
import os
from collections import defaultdict
from typing import Any

import pyarrow.parquet as pq

Row = dict[str, Any]
MAX_QUEUES_CHARTED = 8
MAX_PROBLEMS_SHOWN = 200
LATENCY_METRICS = ("publish_to_first_delivery", "deliver_to_ack", "publish_to_ack")


# the tables the charts are drawn from (warren-report draws them while the job writes the rest)
CHART_TABLES = ("queue_minute", "queue_latency", "consumers", "summary")


def read_tables(out: str, names: tuple[str, ...] | None = None) -> dict[str, list[Row]]:
    """The tables the report shows; ``names``: only these of :data:`CHART_TABLES`."""
    tables: dict[str, list[Row]] = {}
    for name in names or (
        "queue_minute",
        "queue_latency",
        "consumer_latency",
        "consumers",
        "summary",
    ):
        tables[name] = pq.read_table(os.path.join(out, name)).to_pylist()
    tables["queue_minute"].sort(key=lambda r: (r["vhost"], r["queue"], r["minute"]))
    if names is not None:
        return tables
    live = os.path.join(out, "queue_consumers")  # absent from tables written before it
    tables["queue_consumers"] = pq.read_table(live).to_pylist() if os.path.exists(live) else []
    groups = os.path.join(out, "problem_groups")  # absent from tables written before it
    tables["problem_groups"] = pq.read_table(groups).to_pylist() if os.path.exists(groups) else []
    problems = pq.read_table(os.path.join(out, "problems"))
    tables["problems"] = problems.slice(0, MAX_PROBLEMS_SHOWN).to_pylist()
    tables["summary"][0]["problem_messages"] = problems.num_rows
    return tables


# ---- what the numbers say about one queue ----


def queue_rows(tables: dict[str, list[Row]]) -> list[Row]:
    """One row per queue: totals over the whole trace, latest depth, latencies."""
    totals: dict[tuple[str, str], Row] = {}
    numeric = (
        "published",
        "delivered",
        "redelivered",
        "acked",
        "nacked",
        "requeued",
        "retried",
        "timed_out",
        "expired",
        "dead_lettered",
        "dropped",
    )
    for row in tables["queue_minute"]:
        key = (row["vhost"], row["queue"])
        acc = totals.setdefault(
            key, {"vhost": key[0], "queue": key[1], "max_ready": 0, **dict.fromkeys(numeric, 0)}
        )
        for name in numeric:
            acc[name] += row[name]
        for reason in ("expired", "rejected", "maxlen", "delivery_limit"):
            name = f"dead_lettered_{reason}"
            acc[name] = acc.get(name, 0) + row[name]
        acc["ready"], acc["unacked"] = row["ready"], row["unacked"]  # rows are in time order
        acc["max_ready"] = max(acc["max_ready"], row["ready"])
        acc.setdefault("first_ready", row["ready"])
    for row in tables["queue_latency"]:
        queue = totals.get((row["vhost"], row["queue"]))
        if queue is not None:
            queue[row["metric"]] = row
    for row in tables.get("queue_consumers", []):
        queue = totals.get((row["vhost"], row["queue"]))
        if queue is not None:
            queue["live_consumers"] = row["live_consumers"]
            queue["consumers_seen"] = row["consumers_seen"]
    return sorted(totals.values(), key=lambda r: (-r["published"], r["vhost"], r["queue"]))


def plural(count: int, singular: str, plural: str | None = None) -> str:
    """``1 delivery``, ``2 deliveries``: the count and the noun that goes with it."""
    word = singular if count == 1 else (plural or singular + "s")
    return f"{count:,} {word}"


def diagnose(queue: Row, consumers: list[Row]) -> list[str]:
    """Plain-words reasons a queue is slow, most telling first."""
    notes: list[str] = []
    delivered = queue["delivered"] or 0
    wait = queue.get("publish_to_first_delivery")
    work = queue.get("deliver_to_ack")
    if queue["ready"] > 0 and not queue.get("live_consumers"):
        gone = " (every consumer it had was cancelled)" if queue.get("consumers_seen") else ""
        notes.append(
            f"{plural(queue['ready'], 'message')} ready and no consumer at the end of the "
            f"trace{gone}: nothing delivers them until one subscribes"
        )
    if queue["timed_out"]:
        timed_out = plural(queue["timed_out"], "delivery", "deliveries")
        notes.append(f"{timed_out} timed out (consumer_timeout) and came back")
    if delivered and queue["redelivered"] / delivered >= 0.05:
        pct = 100 * queue["redelivered"] / delivered
        notes.append(
            f"{pct:.0f}% of deliveries are redeliveries (nacks, timeouts, closed channels)"
        )
    if wait and work and wait["p99_ms"] > 2 * work["p99_ms"] and wait["p99_ms"] > 100:
        notes.append(
            f"messages wait in the queue: p99 {wait['p99_ms']:.0f} ms before the first delivery, "
            f"against p99 {work['p99_ms']:.0f} ms of processing: too few consumers or prefetch"
        )
    if queue["ready"] > queue.get("first_ready", 0) and queue["ready"] > 10:
        notes.append(
            f"backlog growing: {queue['ready']} ready at the end (max {queue['max_ready']})"
        )
    timed = [c for c in consumers if c.get("processing_p99_ms") is not None]
    if len(timed) > 1:
        timed.sort(key=lambda c: c["processing_p99_ms"], reverse=True)
        slow, rest = timed[0], timed[1:]
        typical = sorted(c["processing_p99_ms"] for c in rest)[len(rest) // 2]
        if slow["processing_p99_ms"] > 2 * typical:
            notes.append(
                f"consumer {slow['consumer']} ({slow['conn']}) is slow: p99 "
                f"{slow['processing_p99_ms']:.0f} ms against {typical:.0f} ms for the others, "
                f"with {100 * (slow['share'] or 0):.0f}% of the deliveries"
            )
    if queue["retried"]:
        notes.append(f"{plural(queue['retried'], 'return')} waited for a delayed retry")
    if queue["expired"]:
        notes.append(f"{plural(queue['expired'], 'message')} expired (TTL) before an ack")
    if queue["dead_lettered"]:
        reasons = ", ".join(
            f"{r} {queue[f'dead_lettered_{r}']}"
            for r in ("expired", "rejected", "maxlen", "delivery_limit")
            if queue[f"dead_lettered_{r}"]
        )
        notes.append(f"{plural(queue['dead_lettered'], 'message')} dead-lettered ({reasons})")
    return notes


def by_queue(rows: list[Row]) -> dict[tuple[str, str], list[Row]]:
    out: dict[tuple[str, str], list[Row]] = defaultdict(list)
    for row in rows:
        out[(row["vhost"], row["queue"])].append(row)
    return out


# ---- charts ----


def _png(fig: Any) -> str:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    # margins fixed by _margins: one drawing (a layout engine or "tight" draws it twice)
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _margins(
    fig: Any, left: float, bottom: float, top: float, hspace: float = 0.0, wspace: float = 0.0
) -> None:
    """Fixed margins in inches (``hspace``/``wspace``: between rows and columns): the
    charts' text is known in advance, so no layout pass measures it."""
    width, height = fig.get_size_inches()
    rows, cols = fig.axes[0].get_gridspec().get_geometry()
    cell_h = (height - top - bottom - hspace * (rows - 1)) / rows
    cell_w = (width - left - 0.15 - wspace * (cols - 1)) / cols
    fig.subplots_adjust(
        left=left / width,
        right=1 - 0.15 / width,
        bottom=bottom / height,
        top=1 - top / height,
        hspace=hspace / cell_h,
        wspace=wspace / cell_w,
    )


def _text_width(labels: list[str], fontsize: float) -> float:
    """About the width in inches of the longest label (DejaVu Sans: about 0.55 em a character)."""
    return max((len(label) for label in labels), default=0) * fontsize * 0.55 / 72


def time_axis(tables: dict[str, list[Row]]) -> tuple[datetime.datetime, datetime.datetime]:
    """The charts' time range: the trace's own, from its first bucket to its last event
    (matplotlib's own choice for a few points of a short trace spans years)."""
    summary = tables["summary"][0]
    first_bucket = min((r["minute"] for r in tables["queue_minute"]), default=None)
    start = summary["first_event"] if first_bucket is None else first_bucket
    start = min(start, summary["first_event"])
    end = summary["last_event"]
    return start, max(end, start + datetime.timedelta(milliseconds=1))


def bucket_length(tables: dict[str, list[Row]]) -> datetime.timedelta | None:
    """The job's bucket (tables written before it was recorded: the smallest gap)."""
    seconds = tables["summary"][0].get("bucket_seconds")
    if seconds:
        return datetime.timedelta(seconds=seconds)
    buckets = sorted({r["minute"] for r in tables["queue_minute"]})
    gaps = [b - a for a, b in itertools.pairwise(buckets) if b > a]
    return min(gaps) if gaps else None


def _with_empty_buckets(rows: list[Row], step: datetime.timedelta | None) -> list[Row]:
    """A queue's rows with a zero row for each bucket without events, so that a rate line
    drops to zero there instead of bridging the gap (the job writes only busy buckets)."""
    if step is None or len(rows) < 2:
        return rows
    out: list[Row] = []
    for row in rows:
        while out and row["minute"] - out[-1]["minute"] > step * 1.5:
            out.append({"minute": out[-1]["minute"] + step})
        out.append(row)
    return out


def preload() -> None:
    """Import matplotlib (a second of CPU), as warren-report does in a thread while
    Spark starts."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates
    import matplotlib.pyplot


def _charts(tables: dict[str, list[Row]], queues: list[Row]) -> dict[str, str]:
    preload()
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    charts: dict[str, str] = {}
    shown = queues[:MAX_QUEUES_CHARTED]
    minutes = by_queue(tables["queue_minute"])
    if not shown:
        return charts
    start, end = time_axis(tables)
    locator = mdates.AutoDateLocator()  # type: ignore[no-untyped-call]
    n = len(shown)
    fig, axes = plt.subplots(n, 2, figsize=(12, 2.5 * n), squeeze=False)
    step = bucket_length(tables)
    for i, queue in enumerate(shown):
        rows = minutes[(queue["vhost"], queue["queue"])]
        t = [r["minute"] for r in rows]
        rate, depth = axes[i][0], axes[i][1]
        filled = _with_empty_buckets(rows, step)
        ft = [r["minute"] for r in filled]
        for name, colour in (
            ("published", "#4c72b0"),
            ("delivered", "#55a868"),
            ("acked", "#8172b2"),
            ("redelivered", "#dd8452"),
            ("expired", "#c44e52"),
            ("dead_lettered", "#937860"),
        ):
            values = [r.get(name, 0) for r in filled]
            if any(values):
                rate.plot(ft, values, label=name, color=colour, marker=".", linewidth=1.2)
        rate.set_title(f"{queue['queue']}: messages per bucket", fontsize=9, loc="left")
        rate.set_ylim(bottom=0)
        for name, colour in (("ready", "#4c72b0"), ("unacked", "#dd8452"), ("delayed", "#8c8c8c")):
            values = [r[name] for r in rows]
            if (any(values) or name == "ready") and rows:
                # held from each bucket to the next, the last one to the trace's end
                depth.step([*t, end], [*values, values[-1]], where="post", label=name, color=colour)
        depth.set_title(f"{queue['queue']}: depth", fontsize=9, loc="left")
        depth.set_ylim(bottom=0)
        for ax in (rate, depth):
            ax.set_xlim(start, end)
            ax.xaxis.set_major_locator(locator)
            ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))  # type: ignore[no-untyped-call]
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7, loc="upper left")
    _margins(fig, left=0.45, bottom=0.45, top=0.3, hspace=0.6, wspace=0.5)
    charts["queues"] = _png(fig)

    fig, ax = plt.subplots(figsize=(12, 0.5 + 0.45 * n * len(LATENCY_METRICS)))
    labels, p50, p95, p99 = [], [], [], []
    for queue in reversed(shown):
        for metric in reversed(LATENCY_METRICS):
            row = queue.get(metric)
            if row is None:
                continue
            labels.append(f"{queue['queue']} {metric.replace('_', ' ')}")
            p50.append(row["p50_ms"])
            p95.append(row["p95_ms"])
            p99.append(row["p99_ms"])
    if labels:
        ys = range(len(labels))
        ax.barh(ys, p99, color="#c44e52", label="p99")
        ax.barh(ys, p95, color="#dd8452", label="p95")
        ax.barh(ys, p50, color="#4c72b0", label="p50")
        ax.set_yticks(list(ys), labels, fontsize=8)
        ax.set_xscale("symlog", linthresh=1)
        ax.set_xlabel("milliseconds (log scale)")
        ax.legend(fontsize=8)
        ax.grid(axis="x", alpha=0.3)
        ax.set_title("Latencies per queue", fontsize=10, loc="left")
        _margins(fig, left=0.2 + _text_width(labels, 8), bottom=0.55, top=0.3)
        charts["latency"] = _png(fig)
    else:
        plt.close(fig)

    consumers = [c for c in tables["consumers"] if c.get("processing_p99_ms") is not None]
    consumers = [
        c
        for c in consumers
        if (c["vhost"], c["queue"]) in {(q["vhost"], q["queue"]) for q in shown}
    ][:30]
    if consumers:
        fig, (left, right) = plt.subplots(1, 2, figsize=(12, 0.6 + 0.32 * len(consumers)))
        names = [f"{c['queue']} / {c['consumer']}" for c in consumers]
        ys = range(len(consumers))
        left.barh(ys, [c["processing_p99_ms"] for c in consumers], color="#c44e52", label="p99")
        left.barh(ys, [c["processing_mean_ms"] for c in consumers], color="#4c72b0", label="mean")
        left.set_yticks(list(ys), names, fontsize=7)
        left.invert_yaxis()
        left.set_xlabel("processing time, delivery to ack (ms)")
        left.legend(fontsize=8)
        right.barh(ys, [100 * (c["share"] or 0) for c in consumers], color="#55a868")
        right.set_yticks(list(ys), [""] * len(consumers))
        right.invert_yaxis()
        right.set_xlabel("share of the queue's deliveries (%)")
        for ax in (left, right):
            ax.grid(axis="x", alpha=0.3)
            ax.tick_params(labelsize=7)
        _margins(fig, left=0.15 + _text_width(names, 7), bottom=0.5, top=0.1, wspace=0.3)
        charts["consumers"] = _png(fig)
    return charts


# ---- HTML ----

_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px 32px;color:#222;max-width:1300px}
h1{font-size:22px;margin-bottom:2px} h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ddd}
.sub{color:#666;margin-top:0} table{border-collapse:collapse;font-size:12.5px;margin:8px 0}
th,td{border:1px solid #ddd;padding:3px 7px;text-align:right;white-space:nowrap}
th{background:#f4f4f6;white-space:normal;vertical-align:bottom}
td.l,th.l{text-align:left} td.path{text-align:left;white-space:normal}
.cards{display:flex;gap:12px;flex-wrap:wrap} .card{border:1px solid #ddd;border-radius:6px;
padding:8px 14px;min-width:120px} .card b{display:block;font-size:20px}
.warn{color:#b02a2a} ul.notes{margin:4px 0 10px 0} img{max-width:100%}
code{background:#f4f4f6;padding:1px 4px;border-radius:3px}
"""


def _e(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:,.1f}" if abs(value) >= 10 else f"{value:,.3g}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    if isinstance(value, datetime.datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    if isinstance(value, list):
        return html.escape(", ".join(str(v) for v in value))
    return html.escape(str(value))


# identifiers print as they are typed into --message: no thousands separators
ID_COLUMNS = ("msg",)


def _example(msg: Any) -> str:
    """A link to the message's row in the problem list, which says how to see its history."""
    text = html.escape(str(msg))
    return f'<a href="#msg-{text}" title="warren-report --trace DIR --message {text}">{text}</a>'


def _table(rows: list[Row], columns: list[tuple[str, str]], left: tuple[str, ...] = ()) -> str:
    head = "".join(
        f'<th class="{"l" if k in left else ""}">{html.escape(t)}</th>' for k, t in columns
    )
    body = []
    for row in rows:
        cells = []
        for key, _ in columns:
            cls = "path" if key == "path" else ("l" if key in left else "")
            value = row.get(key)
            anchor = ""
            if key in ID_COLUMNS and value is not None:
                text = html.escape(str(value))
                anchor = f' id="msg-{text}"'  # the target of a problem group's example
            elif key == "examples" and value:
                text = ", ".join(_example(v) for v in value)
            else:
                text = _e(value)
            cells.append(f'<td class="{cls}"{anchor}>{text}</td>')
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def _lat(row: Row | None, key: str) -> float | None:
    return None if row is None else row.get(key)


def chart_images(out: str) -> dict[str, str]:
    """The charts as data: URLs, from the tables of :data:`CHART_TABLES` in ``out``."""
    tables = read_tables(out, CHART_TABLES)
    return _charts(tables, queue_rows(tables))


def render_html(
    tables: dict[str, list[Row]], trace: str, charts: dict[str, str] | None = None
) -> str:
    """report.html; ``charts``: :func:`chart_images`' of the same tables, if drawn already."""
    summary = tables["summary"][0]
    queues = queue_rows(tables)
    consumers = by_queue(tables["consumers"])
    if charts is None:
        charts = _charts(tables, queues)
    dropped = summary["trace_events_dropped"] or 0
    cards = [
        ("trace events", summary["events"]),
        ("messages", summary["messages"]),
        ("acked", summary["messages_acked"]),
        ("dead-lettered", summary["messages_dead_lettered"]),
        ("expired", summary["messages_expired"]),
        ("never acked", summary["messages_never_acked"]),
        ("consumer timeouts", summary["consumer_timeouts"]),
        ("trace events dropped", dropped),
    ]
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>Warren trace report</title>"
        f"<style>{_CSS}</style></head><body>",
        "<h1>Warren message-lifecycle report</h1>",
        f"<p class='sub'>{_e(trace)} &middot; {_e(summary['first_event'])} to "
        f"{_e(summary['last_event'])} UTC</p>",
        "<div class='cards'>"
        + "".join(
            f"<div class='card{' warn' if label == 'trace events dropped' and value else ''}'>"
            f"<b>{_e(value)}</b>{label}</div>"
            for label, value in cards
        )
        + "</div>",
    ]
    if dropped:
        parts.append(
            f"<p class='warn'>The broker dropped {dropped:,} trace events because its trace "
            "buffer was full: counts below are lower bounds.</p>"
        )
    parts.append("<h2>Queues</h2>")
    rows = []
    for q in queues:
        rows.append(
            {
                **q,
                "wait_p99": _lat(q.get("publish_to_first_delivery"), "p99_ms"),
                "work_p99": _lat(q.get("deliver_to_ack"), "p99_ms"),
                "total_p50": _lat(q.get("publish_to_ack"), "p50_ms"),
                "total_p99": _lat(q.get("publish_to_ack"), "p99_ms"),
            }
        )
    parts.append(
        _table(
            rows,
            [
                ("vhost", "vhost"),
                ("queue", "queue"),
                ("published", "in"),
                ("delivered", "delivered"),
                ("acked", "acked"),
                ("redelivered", "redelivered"),
                ("retried", "retried"),
                ("timed_out", "timed out"),
                ("expired", "expired"),
                ("dead_lettered", "dead-lettered"),
                ("dropped", "dropped"),
                ("ready", "ready now"),
                ("unacked", "unacked now"),
                ("wait_p99", "wait p99 ms"),
                ("work_p99", "processing p99 ms"),
                ("total_p50", "publish→ack p50 ms"),
                ("total_p99", "publish→ack p99 ms"),
            ],
            left=("vhost", "queue"),
        )
    )
    parts.append("<h2>Why is a queue slow?</h2>")
    for q in queues:
        notes = diagnose(q, consumers.get((q["vhost"], q["queue"]), []))
        body = "".join(f"<li>{html.escape(n)}</li>" for n in notes) or "<li>nothing stands out</li>"
        parts.append(
            f"<b>{_e(q['queue'])}</b> <span class='sub'>({_e(q['vhost'])})</span>"
            f"<ul class='notes'>{body}</ul>"
        )
    if "queues" in charts:
        parts.append(f"<h2>Rates and depths</h2><img src='{charts['queues']}'>")
    if "latency" in charts:
        parts.append(f"<h2>Latencies</h2><img src='{charts['latency']}'>")
    parts.append(
        _table(
            tables["queue_latency"],
            [
                ("vhost", "vhost"),
                ("queue", "queue"),
                ("metric", "metric"),
                ("count", "count"),
                ("mean_ms", "mean ms"),
                ("p50_ms", "p50 ms"),
                ("p95_ms", "p95 ms"),
                ("p99_ms", "p99 ms"),
                ("max_ms", "max ms"),
            ],
            left=("vhost", "queue", "metric"),
        )
    )
    parts.append("<h2>Consumers</h2>")
    if "consumers" in charts:
        parts.append(f"<img src='{charts['consumers']}'>")
    parts.append(
        _table(
            tables["consumers"],
            [
                ("queue", "queue"),
                ("consumer", "consumer"),
                ("conn", "connection"),
                ("deliveries", "deliveries"),
                ("share", "share"),
                ("acks", "acks"),
                ("ack_rate", "ack rate"),
                ("nacks", "nacks"),
                ("timeouts", "timeouts"),
                ("redeliveries", "redeliveries"),
                ("processing_mean_ms", "processing mean ms"),
                ("processing_p99_ms", "processing p99 ms"),
            ],
            left=("queue", "consumer", "conn"),
        )
    )
    parts.append(
        _table(
            tables["consumer_latency"],
            [
                ("queue", "queue"),
                ("consumer", "consumer"),
                ("metric", "metric"),
                ("count", "count"),
                ("mean_ms", "mean ms"),
                ("p50_ms", "p50 ms"),
                ("p95_ms", "p95 ms"),
                ("p99_ms", "p99 ms"),
                ("max_ms", "max ms"),
            ],
            left=("queue", "consumer", "metric"),
        )
    )
    if tables["problem_groups"]:
        parts.append("<h2>Problems by queue</h2>")
        parts.append(
            "<p class='sub'>Dead-lettered or dropped (by reason), expired, timed out, never "
            "acked (by the state it was left in) and unroutable, with the first three "
            "messages of each: each links to its row below; its whole history is "
            "<code>warren-report --trace DIR --message ID</code>.</p>"
        )
        parts.append(
            _table(
                tables["problem_groups"],
                [
                    ("queue", "queue"),
                    ("problem", "problem"),
                    ("reason", "reason"),
                    ("messages", "messages"),
                    ("first", "first"),
                    ("last", "last"),
                    ("examples", "examples"),
                ],
                left=("queue", "problem", "reason", "examples"),
            )
        )
    total = summary["problem_messages"]
    shown = len(tables["problems"])
    parts.append(
        f"<h2>Problem messages ({total:,}{'' if shown == total else f', first {shown}'})</h2>"
    )
    parts.append(
        "<p class='sub'>Delivered more than the limit, dead-lettered, expired, dropped or never "
        "acked. The whole history of one: <code>warren-report --trace DIR --message ID</code> "
        "(the broker's id, a message-id or a correlation-id).</p>"
    )
    parts.append(
        _table(
            tables["problems"],
            [
                ("msg", "id"),
                ("message_id", "message-id"),
                ("published", "published"),
                ("problems", "problems"),
                ("outcome", "outcome"),
                ("deliveries", "deliveries"),
                ("path", "path"),
            ],
            left=("message_id", "problems", "outcome", "path"),
        )
    )
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(
    out: str, trace: str, charts: dict[str, str] | None = None
) -> tuple[str, dict[str, list[Row]]]:
    tables = read_tables(out)
    path = os.path.join(out, "report.html")
    with open(path, "w", encoding="utf-8") as f:
        f.write(render_html(tables, trace, charts))
    return path, tables


# ---- terminal ----


def _ms_text(value: float | None) -> str:
    return "" if value is None else f"{value:.1f}ms"


def terminal_summary(tables: dict[str, list[Row]], only_queue: str | None = None) -> str:
    s = tables["summary"][0]
    lines = []
    if only_queue is None:
        lines += [
            f"{s['events']:,} events, {s['messages']:,} messages, "
            f"{_e(s['first_event'])} to {_e(s['last_event'])} UTC",
            f"acked {s['messages_acked']:,}  dead-lettered {s['messages_dead_lettered']:,}  "
            f"expired {s['messages_expired']:,}  never acked {s['messages_never_acked']:,}  "
            f"unroutable {s['messages_unroutable']:,}  "
            f"consumer timeouts {s['consumer_timeouts']:,}",
            f"problem messages: {s['problem_messages']:,}",
        ]
        if s["trace_events_dropped"]:
            lines.append(f"WARNING: {s['trace_events_dropped']:,} trace events were dropped")
        lines.append("")
    header = f"{'queue':<28}{'in':>9}{'deliv':>9}{'acked':>9}{'redel':>8}{'expd':>7}"
    header += f"{'DL':>7}{'tmout':>7}{'ready':>8}{'p99 wait':>10}{'p99 work':>10}"
    lines.append(header)
    consumers = by_queue(tables["consumers"])
    for q in queue_rows(tables):
        if only_queue is not None and q["queue"] != only_queue:
            continue
        wait, work = (
            _ms_text(_lat(q.get(metric), "p99_ms"))
            for metric in ("publish_to_first_delivery", "deliver_to_ack")
        )
        lines.append(
            f"{q['queue'][:27]:<28}{q['published']:>9,}{q['delivered']:>9,}{q['acked']:>9,}"
            f"{q['redelivered']:>8,}{q['expired']:>7,}{q['dead_lettered']:>7,}"
            f"{q['timed_out']:>7,}{q['ready']:>8,}"
            f"{wait:>10}{work:>10}"
        )
        if only_queue is not None:
            for note in diagnose(q, consumers.get((q["vhost"], q["queue"]), [])):
                lines.append(f"  - {note}")
            for c in consumers.get((q["vhost"], q["queue"]), []):
                p99 = c.get("processing_p99_ms")
                lines.append(
                    f"    consumer {c['consumer']} ({c['conn']}): "
                    f"{plural(c['deliveries'], 'delivery', 'deliveries')} "
                    f"({100 * (c['share'] or 0):.0f}%), ack rate {c['ack_rate']}, "
                    f"{plural(c['timeouts'], 'timeout')}, processing p99 "
                    f"{'-' if p99 is None else f'{p99:.1f} ms'}"
                )
    return "\n".join(lines)
