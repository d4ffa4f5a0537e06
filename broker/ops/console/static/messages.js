// A queue's messages on its page: browse them a page at a time (nothing is taken), search,
// act on one (delete, move, send to the tail), and replay dead letters. Every text goes in as
// a text node (h), so nothing a message carries becomes markup.
import { api } from "./api.js";
import { act, ago, badge, h, json, messageSlot, num, replace } from "./ui.js";

const PAGE = 20;

function xDeath(deaths) {
  if (!Array.isArray(deaths) || !deaths.length) return null;
  return h("div", { class: "msg error", dataset: { role: "x-death" } },
    h("b", {}, "Dead-lettered: "),
    deaths.map((d) => h("div", {}, `${d.reason} from queue ${d.queue} (exchange "${d.exchange}", keys ${JSON.stringify(d["routing-keys"])}), ${d.count}\u00d7`)));
}

function when(ms) {
  if (ms === null || ms === undefined) return "arrival time unknown (restored after a restart)";
  return `enqueued ${new Date(ms).toISOString().replace("T", " ").slice(0, 19)} UTC (${ago(ms)})`;
}

// The buttons of one message: they name it by seq, which stays while it is in the queue,
// so a message that moved up meanwhile is still the one acted on (or a 409 says it left)
function actions(path, m, done) {
  const slot = messageSlot();
  const run = (action, body, text) => act(slot, async () => {
    const got = await api("POST", `${path}/messages/${action}`, { seq: m.seq, ...body });
    await done();
    return got;
  }, text);
  const kind = h("select", { name: "kind", "aria-label": "Move to" },
    h("option", { value: "queue" }, "queue"), h("option", { value: "exchange" }, "exchange"));
  const target = h("input", { name: "target", placeholder: "name", "aria-label": "Destination" });
  const key = h("input", { name: "routing_key", placeholder: "routing key", "aria-label": "Routing key" });
  const move = h("form", { class: "inline", dataset: { role: "move" }, onsubmit: (e) => {
    e.preventDefault();
    const body = kind.value === "queue" ? { queue: target.value } : { exchange: target.value };
    if (kind.value === "exchange" && key.value) body.routing_key = key.value;
    run("move", body, "Moved");
  } }, "Move to", kind, target, key, h("button", { type: "submit" }, "Move"));
  return h("div", { class: "actions" },
    h("button", { class: "danger", onclick: () => {
      if (confirm(`Delete message ${m.position + 1}?`)) run("delete", {}, "Deleted");
    } }, "Delete"),
    h("button", { onclick: () => run("to-tail", {}, "Sent to the tail") }, "To tail"),
    move, slot);
}

function messageView(path, m, canChange, stream, done) {
  const props = Array.isArray(m.properties) ? {} : m.properties;
  const facts = [
    `exchange "${m.exchange}"`, `routing key "${m.routing_key}"`, `${num(m.payload_bytes)} bytes`,
    m.payload_encoding, when(m.enqueued_at),
  ];
  if (!stream) facts.push(`${num(m.delivery_count)} deliveries`);
  return h("div", { class: "message", dataset: { role: "message", position: m.position, seq: m.seq } },
    h("div", { class: "actions" }, h("b", {}, stream ? `offset ${m.position}` : `#${m.position + 1}`),
      m.redelivered ? badge("redelivered", "warn") : null,
      m.paged_out ? badge("paged out") : null,
      h("span", { class: "muted" }, facts.join(", "))),
    xDeath(m.x_death),
    h("pre", { dataset: { role: "payload" } }, m.payload),
    Object.keys(props).length ? h("details", {}, h("summary", {}, "Properties and headers"), h("pre", { dataset: { role: "properties" } }, json(props))) : null,
    canChange && !stream ? actions(path, m, done) : null);
}

export function messagesCard(path, { canChange, onChange }) {
  const list = h("div", { dataset: { role: "messages" } });
  const slot = messageSlot();
  const state = { offset: 0, first: 0, search: "", stream: false };
  const search = h("input", { type: "search", name: "search", placeholder: "message_id, correlation_id or header value", "aria-label": "Search messages" });
  const info = h("span", { class: "muted", dataset: { role: "browse-info" } });
  const prev = h("button", { onclick: () => { state.offset = Math.max(state.first, state.offset - PAGE); load(); } }, "\u2039 Prev");
  const next = h("button", {}, "Next \u203a");
  const form = h("form", { class: "toolbar", dataset: { role: "browse" }, onsubmit: (e) => {
    e.preventDefault();
    state.search = search.value.trim();
    state.offset = state.first;
    load();
  } }, search, h("button", { class: "primary", type: "submit" }, "Browse"), slot);

  async function load() {
    await act(slot, async () => {
      const q = new URLSearchParams({ offset: String(state.offset), count: String(PAGE) });
      if (state.search) q.set("search", state.search);
      const rows = await api("GET", `${path}/messages?${q}`);
      const done = async () => { await load(); if (onChange) await onChange(); };
      replace(list, rows.length
        ? rows.map((m) => messageView(path, m, canChange, state.stream, done))
        : h("p", { class: "muted" }, state.search ? "No ready message matches." : "No ready messages here."));
      const what = state.stream ? "offsets" : "positions";
      replace(info, rows.length
        ? `${what} ${num(rows[0].position)}\u2013${num(rows[rows.length - 1].position)}${state.search ? ` matching \u201c${state.search}\u201d` : ""}`
        : "");
      prev.disabled = state.offset <= state.first;
      next.disabled = rows.length < PAGE;
      // a search goes on from after the last match
      if (state.search && rows.length) state.nextOffset = rows[rows.length - 1].position + 1;
    });
  }
  next.onclick = () => {
    state.offset = state.search && state.nextOffset !== undefined ? state.nextOffset : state.offset + PAGE;
    load();
  };

  const el = h("div", { class: "card", dataset: { role: "browse-card" } }, h("h2", {}, "Messages"),
    form,
    h("p", { class: "muted" }, "Browsing takes nothing: counts, order and redelivered flags stay as they are."),
    list,
    h("div", { class: "pager" }, prev, info, next));
  return {
    el,
    // a stream is browsed by offset, from its first one; its messages stay where they are
    start(stream, first) {
      state.stream = stream;
      state.first = state.offset = first || 0;
      search.hidden = stream;
      load();
    },
    load,
  };
}

export function replayCard(path, onChange) {
  const slot = messageSlot();
  const count = h("input", { type: "number", min: "0", name: "replay_count", placeholder: "all", "aria-label": "Messages to replay" });
  const keep = h("input", { type: "checkbox", name: "keep_x_death" });
  const replay = h("button", { class: "primary", onclick: () => act(slot, async () => {
    const body = { keep_x_death: keep.checked };
    if (count.value !== "") body.count = Number(count.value);
    const got = await api("POST", `${path}/replay`, body);
    if (onChange) await onChange();
    return got;
  }, (r) => {
    const where = r.to.map((t) => `${t.messages} to exchange "${t.exchange}" with ${JSON.stringify(t.routing_keys)}`);
    return `Replayed ${r.replayed}${where.length ? ` (${where.join("; ")})` : ""}; ${r.without_x_death} without x-death and ${r.unroutable} unroutable stay`;
  }) }, "Replay dead letters");
  return h("div", { class: "card", dataset: { role: "replay" } }, h("h2", {}, "Dead letters"),
    h("p", { class: "muted" }, "Republishes ready messages to the exchange and routing keys of their first x-death entry; messages without one stay."),
    h("div", { class: "actions" }, h("label", {}, "Count", count), h("label", { class: "check" }, keep, "keep x-death"), replay, slot));
}
