// Small DOM helpers, formatters, a server-paged table and an SVG rate chart.

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (key === "class") el.className = value;
    else if (key === "dataset") Object.assign(el.dataset, value);
    else el.setAttribute(key, value === true ? "" : value);
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : String(child));
  }
}

export function replace(el, ...children) {
  el.replaceChildren();
  append(el, children);
}

export const num = (n) => (n === undefined || n === null ? "" : Number(n).toLocaleString("en"));
export const rate = (details) => (details && typeof details.rate === "number" ? `${details.rate.toFixed(1)}/s` : "");

export function ago(ms) {
  if (!ms) return "";
  const s = Math.max(0, Math.round((Date.now() - ms) / 1000));
  if (s < 60) return `${s}s ago`;
  if (s < 3600) return `${Math.floor(s / 60)}m ago`;
  return `${Math.floor(s / 3600)}h ago`;
}

export const json = (value) => JSON.stringify(value, null, 2);

export function badge(text, kind = "") {
  return h("span", { class: `badge ${kind}` }, text);
}

// A message next to an action: errors stay until the next attempt, successes fade
export function messageSlot() {
  const el = h("span", { class: "msg inline-msg", role: "status", hidden: true });
  el.show = (text, ok = false) => {
    el.hidden = false;
    el.className = `msg inline-msg ${ok ? "ok" : "error"}`;
    el.textContent = text;
  };
  el.clear = () => { el.hidden = true; el.textContent = ""; };
  return el;
}

// Runs an action; its error (the API's reason) shows in the slot, never as a blank page
export async function act(slot, fn, okText) {
  slot.clear();
  try {
    const result = await fn();
    if (okText) slot.show(typeof okText === "function" ? okText(result) : okText, true);
    return result;
  } catch (err) {
    slot.show(err.message || String(err));
    return undefined;
  }
}

export function kv(pairs) {
  return h("dl", { class: "kv" }, pairs.filter(Boolean).map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
}

/* A table whose rows come from the server a page at a time: sorting, filtering and
   paging are query parameters, so 10,000 queues cost one page of rows. */
export class PagedTable {
  constructor({ columns, fetchPage, rowKey, defaultSort = "", pageSize = 50, filters = [] }) {
    this.columns = columns;
    this.fetchPage = fetchPage;
    this.rowKey = rowKey;
    this.state = { page: 1, pageSize, name: "", regex: false, sort: defaultSort, reverse: false };
    this.filter = h("input", { type: "search", placeholder: "Filter by name", "aria-label": "Filter by name", oninput: () => this.debounced() });
    this.regex = h("input", { type: "checkbox", onchange: () => this.reload(1) });
    this.sizeSelect = h("select", { "aria-label": "Rows per page", onchange: () => { this.state.pageSize = Number(this.sizeSelect.value); this.reload(1); } },
      [20, 50, 100, 500].map((n) => h("option", { value: n, selected: n === pageSize }, n)));
    this.error = h("div", { class: "msg error", role: "alert", hidden: true });
    this.head = h("thead");
    this.body = h("tbody");
    this.info = h("span", { class: "muted" });
    this.prev = h("button", { onclick: () => this.reload(this.state.page - 1) }, "\u2039 Prev");
    this.next = h("button", { onclick: () => this.reload(this.state.page + 1) }, "Next \u203a");
    this.el = h("div", { class: "paged" },
      h("div", { class: "toolbar" }, this.filter, h("label", { class: "check" }, this.regex, "regex"), ...filters,
        h("label", { class: "check" }, "rows", this.sizeSelect)),
      this.error,
      h("div", { class: "table-wrap" }, h("table", {}, this.head, this.body)),
      h("div", { class: "pager" }, this.prev, this.info, this.next));
    this.renderHead();
    this.timer = null;
  }

  debounced() {
    clearTimeout(this.timer);
    this.timer = setTimeout(() => this.reload(1), 250);
  }

  renderHead() {
    replace(this.head, h("tr", {}, this.columns.map((col) => {
      const sorted = col.sort && col.sort === this.state.sort;
      return h("th", {
        class: [col.num ? "num" : "", col.sort ? "sortable" : ""].join(" "),
        "aria-sort": sorted ? (this.state.reverse ? "descending" : "ascending") : null,
        tabindex: col.sort ? "0" : null,
        onclick: col.sort ? () => this.sortBy(col) : null,
        onkeydown: col.sort ? (e) => { if (e.key === "Enter") this.sortBy(col); } : null,
      }, col.title);
    })));
  }

  sortBy(col) {
    if (this.state.sort === col.sort) this.state.reverse = !this.state.reverse;
    else { this.state.sort = col.sort; this.state.reverse = Boolean(col.num); }
    this.renderHead();
    this.reload(1);
  }

  // A row already shown keeps its node, and so do its cells that did not change: a click
  // whose mousedown lands before a poll re-renders the table and whose mouseup lands after
  // still finds the same link (a new node in between would swallow the click).
  keep(rows) {
    const shown = new Map();
    for (const tr of this.body.children) if (tr.dataset.key !== undefined) shown.set(tr.dataset.key, tr);
    return rows.map((tr) => {
      const old = shown.get(tr.dataset.key);
      if (!old || old.cells.length !== tr.cells.length) return tr;
      shown.delete(tr.dataset.key); // a key shown twice reuses its node once
      const cells = [...tr.cells];
      [...old.cells].forEach((cell, i) => {
        if (cell.innerHTML !== cells[i].innerHTML || cell.className !== cells[i].className) cell.replaceWith(cells[i]);
      });
      return old;
    });
  }

  async reload(page = this.state.page) {
    this.state.page = Math.max(1, page);
    this.state.name = this.filter.value.trim();
    this.state.regex = this.regex.checked;
    let data;
    try {
      data = await this.fetchPage(this.state);
    } catch (err) {
      if (err.error === "page_out_of_range" && this.state.page > 1) return this.reload(1);
      this.error.hidden = false;
      this.error.textContent = err.message;
      return;
    }
    this.error.hidden = true;
    const rows = data.items.map((item) => h("tr", { dataset: { key: this.rowKey(item) } },
      this.columns.map((col) => h("td", { class: col.num ? "num" : "" }, col.cell(item)))));
    if (!rows.length) rows.push(h("tr", {}, h("td", { colspan: this.columns.length, class: "muted" }, "Nothing to show")));
    replace(this.body, this.keep(rows));
    const shown = data.filtered_count === data.total_count ? `${num(data.total_count)}` : `${num(data.filtered_count)} of ${num(data.total_count)}`;
    this.info.textContent = `page ${data.page} of ${Math.max(1, data.page_count)} \u00b7 ${shown}`;
    this.prev.disabled = data.page <= 1;
    this.next.disabled = data.page >= data.page_count;
  }
}

// Rates over the last minutes: from the server's samples (msg_rates_age) when it sends them,
// else from the polls this page has made
export class RateChart {
  constructor(series, minutes = 10) {
    this.series = series; // [{key, label, color}]
    this.points = [];
    this.span = minutes * 60 * 1000;
    this.svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
    this.svg.setAttribute("viewBox", "0 0 600 140");
    this.svg.setAttribute("preserveAspectRatio", "none");
    this.svg.setAttribute("role", "img");
    this.svg.setAttribute("aria-label", "Message rates");
    this.legend = h("div", { class: "legend" });
    this.el = h("div", { class: "chart" }, this.svg, this.legend);
  }

  // stats: /api/overview's message_stats; true if it carried samples to draw
  update(stats) {
    const first = stats[`${this.series[0].key}_details`]?.samples;
    const now = { t: Date.now(), values: {} };
    for (const s of this.series) now.values[s.key] = stats[`${s.key}_details`]?.rate || 0;
    if (Array.isArray(first) && first.length >= 2) {
      const points = [];
      for (let i = first.length - 2; i >= 0; i--) { // samples come newest first
        const values = {};
        for (const s of this.series) {
          const samples = stats[`${s.key}_details`].samples;
          const seconds = (samples[i].timestamp - samples[i + 1].timestamp) / 1000;
          values[s.key] = seconds > 0 ? Math.max(0, (samples[i].sample - samples[i + 1].sample) / seconds) : 0;
        }
        points.push({ t: first[i].timestamp, values });
      }
      this.points = points;
    } else {
      this.points.push(now);
      this.points = this.points.filter((p) => now.t - p.t <= this.span);
    }
    this.draw(now.values);
  }

  draw(current) {
    const ns = "http://www.w3.org/2000/svg";
    const newest = this.points.at(-1)?.t || 0;
    const oldest = this.points[0]?.t || 0;
    const span = Math.min(this.span, Math.max(1, newest - oldest));
    const max = Math.max(1, ...this.points.flatMap((p) => this.series.map((s) => p.values[s.key] || 0)));
    this.svg.replaceChildren();
    for (const frac of [0.5, 1]) {
      const line = document.createElementNS(ns, "line");
      const y = 135 - frac * 125;
      Object.entries({ x1: 0, x2: 600, y1: y, y2: y, stroke: "currentColor", "stroke-opacity": 0.15 }).forEach(([k, v]) => line.setAttribute(k, v));
      this.svg.append(line);
    }
    for (const s of this.series) {
      const d = this.points.map((p, i) => {
        const x = 600 - ((newest - p.t) / span) * 600;
        const y = 135 - ((p.values[s.key] || 0) / max) * 125;
        return `${i ? "L" : "M"}${x.toFixed(1)},${y.toFixed(1)}`;
      }).join(" ");
      const path = document.createElementNS(ns, "path");
      path.setAttribute("d", d || "M0,135");
      path.setAttribute("fill", "none");
      path.setAttribute("stroke", s.color);
      path.setAttribute("stroke-width", "2");
      path.setAttribute("vector-effect", "non-scaling-stroke");
      this.svg.append(path);
    }
    const shown = span >= 60000 ? `${Math.round(span / 60000)} min` : `${(span / 1000).toFixed(span >= 10000 ? 0 : 1)} s`;
    replace(this.legend, this.series.map((s) => h("span", {}, h("i", { style: `background:${s.color}` }), `${s.label} ${(current[s.key] || 0).toFixed(1)}/s`)),
      h("span", { class: "muted" }, `peak ${max.toFixed(1)}/s over the last ${shown}`));
  }
}
