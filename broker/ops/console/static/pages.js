// Overview, queues, exchanges, connections and channels: read through the API, acted on through it.
import { api, enc, listPage } from "./api.js";
import { messagesCard, replayCard } from "./messages.js";
import { PagedTable, RateChart, act, ago, badge, h, json, kv, messageSlot, num, rate, replace } from "./ui.js";
import { moveMessagesForm } from "./shovel.js";

const qlink = (vhost, name) => `#/queue/${enc(vhost)}/${enc(name)}`;
const xlink = (vhost, name) => `#/exchange/${enc(vhost)}/${enc(name || "amq.default")}`;

function vhostSelect(onchange) {
  const select = h("select", { "aria-label": "Virtual host", onchange }, h("option", { value: "" }, "all vhosts"));
  api("GET", "/vhosts?columns=name").then((vhosts) => {
    for (const v of vhosts) select.append(h("option", { value: v.name }, v.name));
  }).catch(() => {});
  return select;
}

function deadLettered(counts) {
  const entries = Object.entries(counts || {}).filter(([, n]) => n);
  return entries.length ? entries.map(([reason, n]) => `${reason}: ${num(n)}`).join(", ") : "";
}

// ---- overview: totals, live rates, alarms, and what looks stuck ----

export function overview(ctx) {
  const totals = h("div", { class: "grid" });
  const chart = new RateChart([
    { key: "publish", label: "publish", color: "var(--c1)" },
    { key: "deliver_get", label: "deliver", color: "var(--c2)" },
    { key: "ack", label: "ack", color: "var(--c3)" },
  ]);
  const alarms = h("div");
  const stuck = h("div", { dataset: { role: "stuck" } });
  const listeners = h("div");
  const el = h("section", {},
    h("h1", {}, "Overview"), totals,
    h("div", { class: "cols" },
      h("div", { class: "card" }, h("h2", {}, "Message rates"), chart.el),
      h("div", { class: "card" }, h("h2", {}, "Alarms"), alarms, h("h2", {}, "Listeners"), listeners)),
    h("div", { class: "card" }, h("h2", {}, "What is stuck"), stuck));

  async function refresh() {
    const [o, alarm, deep, consumers, delayed] = await Promise.all([
      api("GET", "/overview?msg_rates_age=600&msg_rates_incr=5"),
      api("GET", "/health/checks/alarms").catch((err) => ({ status: "failed", reason: err.message })),
      listPage("/queues", { pageSize: 5, sort: "messages", reverse: true,
        columns: "name,vhost,messages,messages_ready,messages_unacknowledged,consumers,messages_dead_lettered" }),
      api("GET", "/consumers"),
      listPage("/queues", { pageSize: 5, sort: "messages_delayed", reverse: true, columns: "name,vhost,messages_delayed" }),
    ]);
    const t = o.object_totals || {};
    const qt = o.queue_totals || {};
    const stat = (label, value, testid) => h("div", { class: "stat", dataset: { stat: testid } }, h("b", {}, num(value)), h("span", {}, label));
    replace(totals,
      stat("connections", t.connections, "connections"), stat("channels", t.channels, "channels"),
      stat("queues", t.queues, "queues"), stat("consumers", t.consumers, "consumers"),
      stat("ready", qt.messages_ready, "ready"), stat("unacked", qt.messages_unacknowledged, "unacked"));
    chart.update(o.message_stats || {});
    replace(alarms, alarm.status === "ok"
      ? badge("no alarms", "ok")
      : h("div", { class: "msg error" }, alarm.reason || "alarm",
        (alarm.alarms || []).map((a) => h("div", {}, `${a.resource} alarm on ${a.node}: publishers are blocked`))));
    replace(listeners, h("ul", {}, (o.listeners || []).map((l) => h("li", {}, `${l.protocol} ${l.ip_address}:${l.port}`))),
      h("p", { class: "muted" }, `${o.product_name} ${o.product_version} on ${o.node}`));
    const rows = [];
    for (const c of consumers.filter((c) => c.timed_out)) {
      rows.push(h("li", {}, badge("timed out", "err"), " consumer ", h("code", {}, c.consumer_tag), " on ",
        h("a", { href: qlink(c.queue.vhost, c.queue.name) }, c.queue.name),
        ` \u2014 ${num(c.timed_out_deliveries)} deliveries passed the ${num(c.consumer_timeout)} ms timeout; it gets nothing new until they are settled`));
    }
    for (const c of consumers.filter((c) => c.stuck && !c.timed_out)) {
      const full = c.prefetch_count > 0 && c.messages_unacknowledged >= c.prefetch_count;
      rows.push(h("li", { dataset: { stuck: c.consumer_tag } }, badge("stuck", "warn"), " consumer ", h("code", {}, c.consumer_tag), " on ",
        h("a", { href: qlink(c.queue.vhost, c.queue.name) }, c.queue.name),
        ` \u2014 its oldest of ${num(c.messages_unacknowledged)} unacked deliveries has waited ${num(Math.round(c.oldest_unacked_ms / 1000))} s`,
        full ? ` and it holds its whole prefetch (${num(c.prefetch_count)}): it gets nothing new until it settles` : ""));
    }
    for (const q of deep.items.filter((q) => q.messages > 0)) {
      const why = q.consumers === 0 ? "no consumers" : q.messages_unacknowledged > 0 && q.messages_ready === 0 ? "all delivered, waiting for acks" : `${q.consumers} consumer(s)`;
      rows.push(h("li", {}, badge(`${num(q.messages)} message${q.messages === 1 ? "" : "s"}`, q.consumers === 0 ? "warn" : ""), " in ",
        h("a", { href: qlink(q.vhost, q.name) }, q.name), ` \u2014 ${why}`,
        deadLettered(q.messages_dead_lettered) ? ` \u00b7 dead-lettered ${deadLettered(q.messages_dead_lettered)}` : ""));
    }
    for (const q of delayed.items.filter((q) => q.messages_delayed > 0)) {
      rows.push(h("li", {}, badge(`${num(q.messages_delayed)} delayed`, "warn"), " in ",
        h("a", { href: qlink(q.vhost, q.name) }, q.name), " \u2014 waiting for a retry"));
    }
    replace(stuck, rows.length ? h("ul", {}, rows) : h("p", { class: "muted" }, "Nothing waiting: no timed-out or stuck consumers, delayed retries or backed-up queues."));
  }
  return { el, refresh };
}

// ---- queues ----

const QUEUE_COLUMNS = "name,vhost,type,policy,state,messages_ready,messages_unacknowledged,messages_delayed,consumers,consumer_timeouts,messages_dead_lettered,message_stats.publish_details,message_stats.deliver_get_details,message_stats.ack_details";

export function queues(ctx) {
  const vhost = vhostSelect(() => table.reload(1));
  const table = new PagedTable({
    rowKey: (q) => `${q.vhost}/${q.name}`,
    defaultSort: "name",
    filters: [vhost],
    columns: [
      { title: "Name", sort: "name", cell: (q) => h("a", { href: qlink(q.vhost, q.name) }, q.name) },
      { title: "Vhost", sort: "vhost", cell: (q) => q.vhost },
      { title: "Type", sort: "type", cell: (q) => q.type },
      { title: "Policy", sort: "policy", cell: (q) => q.policy || "" },
      { title: "Ready", sort: "messages_ready", num: true, cell: (q) => num(q.messages_ready) },
      { title: "Unacked", sort: "messages_unacknowledged", num: true, cell: (q) => num(q.messages_unacknowledged) },
      { title: "Delayed", sort: "messages_delayed", num: true, cell: (q) => num(q.messages_delayed) },
      { title: "Consumers", sort: "consumers", num: true, cell: (q) => num(q.consumers) },
      { title: "Publish", sort: "message_stats.publish_details.rate", num: true, cell: (q) => rate(q.message_stats?.publish_details) },
      { title: "Deliver", sort: "message_stats.deliver_get_details.rate", num: true, cell: (q) => rate(q.message_stats?.deliver_get_details) },
      { title: "Ack", sort: "message_stats.ack_details.rate", num: true, cell: (q) => rate(q.message_stats?.ack_details) },
      { title: "Timeouts", sort: "consumer_timeouts", num: true, cell: (q) => (q.consumer_timeouts ? badge(num(q.consumer_timeouts), "err") : "") },
      { title: "Dead-lettered", cell: (q) => deadLettered(q.messages_dead_lettered) },
    ],
    fetchPage: (s) => listPage(vhost.value ? `/queues/${enc(vhost.value)}` : "/queues", { ...s, columns: QUEUE_COLUMNS }),
  });
  const el = h("section", {}, h("h1", {}, "Queues"), table.el, addQueueForm(ctx, () => table.reload()));
  return { el, refresh: () => table.reload() };
}

function addQueueForm(ctx, done) {
  if (!ctx.user.isAdmin) return null;
  const slot = messageSlot();
  const form = h("form", { class: "card", onsubmit: async (e) => {
    e.preventDefault();
    const f = e.target;
    await act(slot, async () => {
      const args = f.arguments.value.trim() ? JSON.parse(f.arguments.value) : {};
      if (f.qtype.value) args["x-queue-type"] = f.qtype.value;
      await api("PUT", `/queues/${enc(f.vhost.value)}/${enc(f.name.value)}`, { durable: f.durable.checked, auto_delete: false, arguments: args });
      done();
    }, "Queue declared");
  } },
  h("h2", {}, "Add a queue"),
  h("label", {}, "Vhost", h("input", { name: "vhost", value: "/", required: true })),
  h("label", {}, "Name", h("input", { name: "name", required: true })),
  h("label", {}, "Type", h("select", { name: "qtype" }, ["", "classic", "quorum", "stream"].map((t) => h("option", { value: t }, t || "default")))),
  h("label", { class: "check" }, h("input", { type: "checkbox", name: "durable", checked: true }), "durable"),
  h("label", {}, "Arguments (JSON)", h("textarea", { name: "arguments", placeholder: '{"x-max-length": 1000}' })),
  h("div", { class: "actions" }, h("button", { class: "primary", type: "submit" }, "Add queue"), slot));
  return h("details", {}, h("summary", {}, "Add a queue"), form);
}

function consumerRow(c) {
  const state = c.timed_out
    ? badge(`timed out (${num(c.timed_out_deliveries)})`, "err")
    : c.activity_status === "waiting" ? badge("waiting", "warn") : badge("active", "ok");
  return h("tr", { dataset: { tag: c.consumer_tag } },
    h("td", {}, h("code", {}, c.consumer_tag)),
    h("td", {}, c.channel_details?.name || ""),
    h("td", {}, c.channel_details?.user || ""),
    h("td", { class: "num" }, num(c.prefetch_count)),
    h("td", { class: "num" }, num(c.messages_unacknowledged)),
    h("td", { class: "num" }, c.consumer_timeout === null || c.consumer_timeout === undefined ? "" : `${num(c.consumer_timeout)} ms`),
    h("td", { dataset: { role: "state" } }, state),
    h("td", {}, c.ack_required ? "manual" : "auto"));
}

function table(head, rows, empty = "None") {
  return h("div", { class: "table-wrap" }, h("table", {},
    h("thead", {}, h("tr", {}, head.map((t) => h("th", { class: /^(Prefetch|Unacked|Timeout)$/.test(t) ? "num" : "" }, t)))),
    h("tbody", {}, rows.length ? rows : h("tr", {}, h("td", { colspan: head.length, class: "muted" }, empty)))));
}

export function queue(ctx) {
  const [vhost, name] = ctx.params;
  const path = `/queues/${enc(vhost)}/${enc(name)}`;
  const canChange = ctx.user.isAdmin;
  const summary = h("div");
  const counters = h("div", { class: "grid" });
  const consumers = h("div");
  const bindings = h("div");
  // browse (nothing taken), act on one message, replay dead letters (./messages.js)
  const browse = messagesCard(path, { canChange, onChange: () => refresh() });
  let browsing = false;
  const actionSlot = messageSlot();
  const purge = h("button", { class: "danger", onclick: () => {
    if (!confirm(`Purge every ready message of ${name}?`)) return;
    act(actionSlot, async () => { await api("DELETE", `${path}/contents`); await browse.load(); await refresh(); }, "Purged");
  } }, "Purge");
  const del = h("button", { class: "danger", onclick: () => {
    if (!confirm(`Delete queue ${name}?`)) return;
    act(actionSlot, async () => { await api("DELETE", path); location.hash = "#/queues"; });
  } }, "Delete queue");

  // a stream has no purge and its messages cannot be taken out (RabbitMQ's management UI:
  // QUEUE_TYPE["stream"].actions); it is browsed by offset
  const replay = canChange ? replayCard(path, () => Promise.all([browse.load(), refresh()])) : null;
  const el = h("section", {},
    h("p", {}, h("a", { href: "#/queues" }, "\u2039 Queues")),
    h("h1", {}, "Queue ", h("span", { class: "object-name", dataset: { role: "name" } }, name),
      h("span", { class: "muted vhost" }, ` in vhost ${vhost}`)),
    counters,
    h("div", { class: "card" }, h("h2", {}, "Consumers"), consumers),
    browse.el,
    replay,
    h("div", { class: "cols" }, h("div", { class: "card" }, h("h2", {}, "Details"), summary),
      h("div", { class: "card" }, h("h2", {}, "Bindings"), bindings)),
    canChange ? publishForm(vhost, "", name, refresh) : null,
    canChange ? moveMessagesForm(vhost, name, refresh) : null,
    canChange ? h("div", { class: "card" }, h("h2", {}, "Danger zone"), h("div", { class: "actions" }, purge, del, actionSlot)) : null);

  async function refresh() {
    const [q, b] = await Promise.all([api("GET", path), api("GET", `${path}/bindings`)]);
    if (!browsing) {
      browsing = true;
      browse.start(q.type === "stream", q.type === "stream" ? q.first_offset : 0);
    }
    if (q.type === "stream") return showStream(q, b);
    const pol = q.policy ? h("a", { href: "#/policies" }, q.policy) : h("span", { class: "muted" }, "none");
    replace(summary, kv([
      ["Type", q.type], ["State", q.state], ["Durable", String(q.durable)], ["Auto-delete", String(q.auto_delete)],
      ["Exclusive", String(q.exclusive)], ["Policy", pol],
      ["Arguments", h("pre", { dataset: { role: "arguments" } }, json(q.arguments))],
      ["Effective policy", h("pre", { dataset: { role: "effective-policy" } }, json(q.effective_policy_definition))],
      ["Message bytes ready", num(q.message_bytes_ready)],
    ]));
    const stat = (label, value, key, kind) => h("div", { class: `stat ${kind || ""}`, dataset: { stat: key } }, h("b", {}, value), h("span", {}, label));
    replace(counters,
      stat("ready", num(q.messages_ready), "ready"), stat("unacked", num(q.messages_unacknowledged), "unacked"),
      stat("delayed (retry)", num(q.messages_delayed), "delayed"), stat("consumers", num(q.consumers), "consumers"),
      stat("publish", rate(q.message_stats?.publish_details) || "0.0/s", "publish"),
      stat("deliver", rate(q.message_stats?.deliver_get_details) || "0.0/s", "deliver"),
      stat("consumer timeouts", num(q.consumer_timeouts), "timeouts"),
      stat("retried", num(q.messages_retried), "retried"), stat("expired", num(q.messages_expired), "expired"),
      stat("dead-lettered", deadLettered(q.messages_dead_lettered) || "0", "dead-lettered"));
    replace(consumers, table(["Tag", "Channel", "User", "Prefetch", "Unacked", "Timeout", "State", "Ack"],
      (q.consumer_details || []).map(consumerRow), "No consumers"));
    showBindings(b);
  }

  // RabbitMQ's stream-queue-stats: messages (total), consumers, readers, segments, oldest message
  function showStream(q, b) {
    purge.hidden = true;
    if (replay) replay.hidden = true;
    const pol = q.policy ? h("a", { href: "#/policies" }, q.policy) : h("span", { class: "muted" }, "none");
    replace(summary, kv([
      ["Type", q.type], ["State", q.state], ["Durable", String(q.durable)], ["Policy", pol],
      ["Segments", num(q.segments)], ["First offset", num(q.first_offset)],
      ["Committed offset", q.committed_offset === null ? "none" : num(q.committed_offset)],
      ["Oldest message", q.first_timestamp ? new Date(q.first_timestamp).toISOString() : "none"],
      ["Bytes on disk", num(q.stream_bytes)],
      ["Arguments", h("pre", { dataset: { role: "arguments" } }, json(q.arguments))],
      ["Effective policy", h("pre", { dataset: { role: "effective-policy" } }, json(q.effective_policy_definition))],
    ]));
    const stat = (label, value, key) => h("div", { class: "stat", dataset: { stat: key } }, h("b", {}, value), h("span", {}, label));
    replace(counters,
      stat("messages", num(q.messages), "messages"), stat("consumers", num(q.consumers), "consumers"),
      stat("segments", num(q.segments), "segments"),
      stat("publish", rate(q.message_stats?.publish_details) || "0.0/s", "publish"),
      stat("deliver", rate(q.message_stats?.deliver_get_details) || "0.0/s", "deliver"));
    // each consumer's place in the log: the offset of the next message it gets
    const offsets = new Map((q.reader_offsets || []).map((r) => [`${r.channel}/${r.consumer_tag}`, r.offset]));
    replace(consumers, table(["Tag", "Channel", "User", "Prefetch", "Next offset"],
      (q.consumer_details || []).map((c) => h("tr", { dataset: { tag: c.consumer_tag } },
        h("td", {}, h("code", {}, c.consumer_tag)),
        h("td", {}, c.channel_details?.name || ""),
        h("td", {}, c.channel_details?.user || ""),
        h("td", { class: "num" }, num(c.prefetch_count)),
        h("td", { class: "num", dataset: { role: "offset" } },
          num(offsets.get(`${c.channel_details?.number}/${c.consumer_tag}`))))), "No consumers"));
    showBindings(b);
  }

  function showBindings(b) {
    replace(bindings, table(["From exchange", "Routing key", "Arguments"], b.map((x) => h("tr", {},
      h("td", {}, x.source ? h("a", { href: xlink(x.vhost, x.source) }, x.source) : "(default)"),
      h("td", {}, h("code", {}, x.routing_key)), h("td", {}, Object.keys(x.arguments || {}).length ? json(x.arguments) : "")))));
  }
  return { el, refresh };
}

function publishForm(vhost, exchange, routingKey, done) {
  const slot = messageSlot();
  const form = h("form", { class: "card", dataset: { role: "publish" }, onsubmit: async (e) => {
    e.preventDefault();
    const f = e.target;
    await act(slot, async () => {
      let headers = {};
      if (f.headers.value.trim()) {
        try { headers = JSON.parse(f.headers.value); } catch (err) { throw new Error(`Headers are not JSON: ${err.message}`); }
      }
      const properties = { delivery_mode: f.persistent.checked ? 2 : 1, headers };
      if (f.content_type.value) properties.content_type = f.content_type.value;
      const result = await api("POST", `/exchanges/${enc(vhost)}/${enc(exchange || "amq.default")}/publish`,
        { routing_key: f.routing_key.value, properties, payload: f.payload.value, payload_encoding: "string" });
      if (done) await done();
      return result;
    }, (r) => (r.routed ? "Published: the message was routed" : "Published, but no queue was bound for it (not routed)"));
  } },
  h("h2", {}, exchange ? "Publish to this exchange" : "Publish to this queue"),
  h("label", {}, "Routing key", h("input", { name: "routing_key", value: routingKey || "", readonly: exchange ? null : true })),
  h("label", {}, "Content type", h("input", { name: "content_type", placeholder: "application/json" })),
  h("label", { class: "check" }, h("input", { type: "checkbox", name: "persistent" }), "persistent"),
  h("label", { class: "block" }, "Headers (JSON object)", h("textarea", { name: "headers", placeholder: '{"x-trace": "1"}' })),
  h("label", { class: "block" }, "Payload", h("textarea", { name: "payload" })),
  h("div", { class: "actions" }, h("button", { class: "primary", type: "submit" }, "Publish"), slot));
  return form;
}

// ---- exchanges ----

export function exchanges(ctx) {
  const vhost = vhostSelect(() => t.reload(1));
  const t = new PagedTable({
    rowKey: (x) => `${x.vhost}/${x.name}`,
    defaultSort: "name",
    filters: [vhost],
    columns: [
      { title: "Name", sort: "name", cell: (x) => h("a", { href: xlink(x.vhost, x.name) }, x.name || "(AMQP default)") },
      { title: "Vhost", sort: "vhost", cell: (x) => x.vhost },
      { title: "Type", sort: "type", cell: (x) => x.type },
      { title: "Features", cell: (x) => [x.durable ? "D " : "", x.auto_delete ? "AD " : "", x.internal ? "I" : ""].join("") },
      { title: "Arguments", cell: (x) => (Object.keys(x.arguments || {}).length ? JSON.stringify(x.arguments) : "") },
    ],
    fetchPage: (s) => listPage(vhost.value ? `/exchanges/${enc(vhost.value)}` : "/exchanges", s),
  });
  const el = h("section", {}, h("h1", {}, "Exchanges"), t.el, addExchangeForm(ctx, () => t.reload()));
  return { el, refresh: () => t.reload() };
}

// the built-in types and those RabbitMQ users install plugins for (docs/plugin-exchanges.md)
const EXCHANGE_TYPES = ["direct", "fanout", "topic", "headers", "x-delayed-message",
  "x-consistent-hash", "x-modulus-hash", "x-local-random"];

function addExchangeForm(ctx, done) {
  if (!ctx.user.isAdmin) return null;
  const slot = messageSlot();
  const form = h("form", { class: "card", dataset: { role: "add-exchange" }, onsubmit: async (e) => {
    e.preventDefault();
    const f = e.target;
    await act(slot, async () => {
      const args = f.arguments.value.trim() ? JSON.parse(f.arguments.value) : {};
      await api("PUT", `/exchanges/${enc(f.vhost.value)}/${enc(f.name.value)}`,
        { type: f.xtype.value, durable: f.durable.checked, auto_delete: false, arguments: args });
      done();
    }, "Exchange declared");
  } },
  h("h2", {}, "Add an exchange"),
  h("label", {}, "Vhost", h("input", { name: "vhost", value: "/", required: true })),
  h("label", {}, "Name", h("input", { name: "name", required: true })),
  h("label", {}, "Type", h("select", { name: "xtype" }, EXCHANGE_TYPES.map((t) => h("option", { value: t }, t)))),
  h("label", { class: "check" }, h("input", { type: "checkbox", name: "durable", checked: true }), "durable"),
  h("label", {}, "Arguments (JSON)", h("textarea", { name: "arguments", placeholder: '{"x-delayed-type": "direct"}' })),
  h("div", { class: "actions" }, h("button", { class: "primary", type: "submit" }, "Add exchange"), slot));
  return h("details", {}, h("summary", {}, "Add an exchange"), form);
}

export function exchange(ctx) {
  const [vhost, name] = ctx.params;
  const real = name === "amq.default" ? "" : name;
  const path = `/exchanges/${enc(vhost)}/${enc(name)}`;
  const info = h("div");
  const bindings = h("div");
  const el = h("section", {},
    h("p", {}, h("a", { href: "#/exchanges" }, "\u2039 Exchanges")),
    h("h1", {}, "Exchange ", h("span", { class: "object-name", dataset: { role: "name" } }, real || "(AMQP default)"),
      h("span", { class: "muted vhost" }, ` in vhost ${vhost}`)),
    h("div", { class: "cols" }, h("div", { class: "card" }, h("h2", {}, "Details"), info),
      h("div", { class: "card" }, h("h2", {}, "Bindings from here"), bindings)),
    ctx.user.isAdmin ? publishForm(vhost, real || "amq.default", "", null) : null);
  async function refresh() {
    const x = await api("GET", path);
    replace(info, kv([["Type", x.type], ["Durable", String(x.durable)], ["Auto-delete", String(x.auto_delete)],
      ["Internal", String(x.internal)], ["Arguments", h("pre", {}, json(x.arguments))],
      // x-delayed-message: the messages it holds until their x-delay is over
      ...(x.messages_delayed === undefined ? [] : [["Messages delayed", num(x.messages_delayed)]])]));
    if (!real) { replace(bindings, h("p", { class: "muted" }, "Every queue, by its name.")); return; }
    const b = await api("GET", `${path}/bindings/source`);
    replace(bindings, table(["To", "Routing key", "Arguments"], b.map((y) => h("tr", {},
      h("td", {}, y.destination_type === "queue" ? h("a", { href: qlink(y.vhost, y.destination) }, y.destination) : h("a", { href: xlink(y.vhost, y.destination) }, `exchange ${y.destination}`)),
      h("td", {}, h("code", {}, y.routing_key)), h("td", {}, Object.keys(y.arguments || {}).length ? json(y.arguments) : "")))));
  }
  return { el, refresh };
}

// ---- connections and channels ----

export function connections(ctx) {
  const t = new PagedTable({
    rowKey: (c) => c.name,
    defaultSort: "name",
    columns: [
      { title: "Name", sort: "name", cell: (c) => [c.name, c.user_provided_name ? h("div", { class: "muted" }, c.user_provided_name) : null] },
      { title: "User", sort: "user", cell: (c) => c.user },
      { title: "Vhost", sort: "vhost", cell: (c) => c.vhost },
      { title: "Client", sort: "client_properties.product", cell: (c) => `${c.client_properties?.product || "?"} ${c.client_properties?.version || ""}` },
      { title: "Platform", cell: (c) => c.client_properties?.platform || "" },
      { title: "Channels", sort: "channels", num: true, cell: (c) => num(c.channels) },
      { title: "Heartbeat", num: true, cell: (c) => `${c.timeout}s` },
      { title: "Connected", sort: "connected_at", cell: (c) => ago(c.connected_at) },
      { title: "", cell: (c) => closeButton(ctx, c, () => t.reload()) },
    ],
    fetchPage: (s) => listPage("/connections", s),
  });
  return { el: h("section", {}, h("h1", {}, "Connections"), t.el), refresh: () => t.reload() };
}

function closeButton(ctx, conn, done) {
  if (!ctx.user.isAdmin && conn.user !== ctx.user.name) return "";
  const slot = messageSlot();
  return h("span", {}, h("button", { class: "danger", onclick: () => {
    if (!confirm(`Close connection ${conn.name}?`)) return;
    act(slot, async () => {
      await api("DELETE", `/connections/${enc(conn.name)}`, undefined, { headers: { "X-Reason": `Closed from the Warren console by ${ctx.user.name}` } });
      await done();
    });
  } }, "Close"), slot);
}

export function channels() {
  const t = new PagedTable({
    rowKey: (c) => c.name,
    defaultSort: "name",
    columns: [
      { title: "Channel", sort: "name", cell: (c) => c.name },
      { title: "User", sort: "user", cell: (c) => c.user },
      { title: "Vhost", sort: "vhost", cell: (c) => c.vhost },
      { title: "Mode", cell: (c) => [c.confirm ? "confirm " : "", c.transactional ? "tx" : ""].join("") },
      { title: "State", sort: "state", cell: (c) => (c.state === "running" ? c.state : badge(c.state, "warn")) },
      { title: "Consumers", sort: "consumer_count", num: true, cell: (c) => num(c.consumer_count) },
      { title: "Prefetch", sort: "prefetch_count", num: true, cell: (c) => num(c.prefetch_count) },
      { title: "Unacked", sort: "messages_unacknowledged", num: true, cell: (c) => num(c.messages_unacknowledged) },
      { title: "Unconfirmed", sort: "messages_unconfirmed", num: true, cell: (c) => num(c.messages_unconfirmed) },
    ],
    fetchPage: (s) => listPage("/channels", s),
  });
  return { el: h("section", {}, h("h1", {}, "Channels"), t.el), refresh: () => t.reload() };
}
