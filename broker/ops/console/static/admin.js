// Policies (administrators and policymakers change them) and users, vhosts, permissions (administrators).
import { api, enc } from "./api.js";
import { act, h, json, messageSlot, replace } from "./ui.js";

function simpleTable(head, rows, empty = "None") {
  return h("div", { class: "table-wrap" }, h("table", {},
    h("thead", {}, h("tr", {}, head.map((t) => h("th", {}, t)))),
    h("tbody", {}, rows.length ? rows : h("tr", {}, h("td", { colspan: head.length, class: "muted" }, empty)))));
}

export function policies(ctx) {
  const list = h("div");
  const slot = messageSlot();
  const listSlot = messageSlot();
  const form = h("form", { class: "card", dataset: { role: "policy-form" }, onsubmit: async (e) => {
    e.preventDefault();
    const f = e.target;
    await act(slot, async () => {
      let definition;
      try { definition = JSON.parse(f.definition.value || "{}"); } catch (err) { throw new Error(`Definition is not JSON: ${err.message}`); }
      await api("PUT", `/policies/${enc(f.vhost.value)}/${enc(f.name.value)}`, {
        pattern: f.pattern.value, definition, priority: Number(f.priority.value || 0), "apply-to": f.applyto.value,
      });
      await refresh();
    }, "Policy saved");
  } },
  h("h2", {}, "Add or edit a policy"),
  h("label", {}, "Vhost", h("input", { name: "vhost", value: "/", required: true })),
  h("label", {}, "Name", h("input", { name: "name", required: true })),
  h("label", {}, "Pattern (regex)", h("input", { name: "pattern", value: "^" })),
  h("label", {}, "Apply to", h("select", { name: "applyto" }, ["all", "queues", "classic_queues", "quorum_queues", "streams", "exchanges"].map((v) => h("option", { value: v }, v)))),
  h("label", {}, "Priority", h("input", { name: "priority", type: "number", value: "0" })),
  h("label", { class: "block" }, "Definition (JSON)", h("textarea", { name: "definition", placeholder: '{"consumer-timeout": 60000, "max-length": 10000}' })),
  h("div", { class: "actions" }, h("button", { class: "primary", type: "submit" }, "Save policy"), slot));

  function edit(p) {
    form.vhost.value = p.vhost;
    form.name.value = p.name;
    form.pattern.value = p.pattern;
    form.applyto.value = p["apply-to"];
    form.priority.value = p.priority;
    form.definition.value = json(p.definition);
    form.scrollIntoView({ block: "nearest" });
  }

  async function refresh() {
    const items = await api("GET", "/policies");
    replace(list, simpleTable(["Vhost", "Name", "Pattern", "Apply to", "Priority", "Definition", ""], items.map((p) => h("tr", { dataset: { policy: p.name } },
      h("td", {}, p.vhost), h("td", {}, p.name), h("td", {}, h("code", {}, p.pattern)), h("td", {}, p["apply-to"]),
      h("td", {}, String(p.priority)), h("td", {}, h("code", {}, JSON.stringify(p.definition))),
      h("td", {}, ctx.user.canPolicy ? [
        h("button", { onclick: () => edit(p) }, "Edit"), " ",
        h("button", { class: "danger", onclick: () => {
          if (!confirm(`Delete policy ${p.name}?`)) return;
          act(listSlot, async () => { await api("DELETE", `/policies/${enc(p.vhost)}/${enc(p.name)}`); await refresh(); }, "Policy deleted");
        } }, "Delete")] : ""))), "No policies"));
  }
  const el = h("section", {}, h("h1", {}, "Policies"), listSlot, list, ctx.user.canPolicy ? form : null);
  return { el, refresh };
}

export function adminPage(ctx) {
  const users = h("div");
  const vhosts = h("div");
  const perms = h("div");
  const slots = { user: messageSlot(), vhost: messageSlot(), perm: messageSlot(), list: messageSlot() };
  const remove = (label, path) => h("button", { class: "danger", onclick: () => {
    if (!confirm(`Delete ${label}?`)) return;
    act(slots.list, async () => { await api("DELETE", path); await refresh(); }, `Deleted ${label}`);
  } }, "Delete");

  const userForm = h("form", { class: "card", onsubmit: (e) => {
    e.preventDefault();
    const f = e.target;
    act(slots.user, async () => { await api("PUT", `/users/${enc(f.name.value)}`, { password: f.password.value, tags: f.tags.value }); await refresh(); }, "User saved");
  } }, h("h2", {}, "Add or update a user"),
  h("label", {}, "Name", h("input", { name: "name", required: true })),
  h("label", {}, "Password", h("input", { name: "password", type: "password", autocomplete: "new-password" })),
  h("label", {}, "Tags (comma-separated)", h("input", { name: "tags", placeholder: "monitoring" })),
  h("div", { class: "actions" }, h("button", { class: "primary", type: "submit" }, "Save user"), slots.user));

  const vhostForm = h("form", { class: "card", onsubmit: (e) => {
    e.preventDefault();
    const f = e.target;
    act(slots.vhost, async () => { await api("PUT", `/vhosts/${enc(f.name.value)}`, { description: f.description.value }); await refresh(); }, "Vhost saved");
  } }, h("h2", {}, "Add a vhost"),
  h("label", {}, "Name", h("input", { name: "name", required: true })),
  h("label", {}, "Description", h("input", { name: "description" })),
  h("div", { class: "actions" }, h("button", { class: "primary", type: "submit" }, "Add vhost"), slots.vhost));

  const permForm = h("form", { class: "card", onsubmit: (e) => {
    e.preventDefault();
    const f = e.target;
    act(slots.perm, async () => {
      await api("PUT", `/permissions/${enc(f.vhost.value)}/${enc(f.user.value)}`, { configure: f.configure.value, write: f.write.value, read: f.read.value });
      await refresh();
    }, "Permissions set");
  } }, h("h2", {}, "Set permissions"),
  h("label", {}, "User", h("input", { name: "user", required: true })),
  h("label", {}, "Vhost", h("input", { name: "vhost", value: "/", required: true })),
  ["configure", "write", "read"].map((k) => h("label", {}, k, h("input", { name: k, value: ".*" }))),
  h("div", { class: "actions" }, h("button", { class: "primary", type: "submit" }, "Set"), slots.perm));

  async function refresh() {
    const [u, v, p] = await Promise.all([api("GET", "/users"), api("GET", "/vhosts"), api("GET", "/permissions")]);
    replace(users, simpleTable(["Name", "Tags", ""], u.map((x) => h("tr", {}, h("td", {}, x.name),
      h("td", {}, Array.isArray(x.tags) ? x.tags.join(", ") : x.tags), h("td", {}, remove(`user ${x.name}`, `/users/${enc(x.name)}`))))));
    replace(vhosts, simpleTable(["Name", "Description", "Messages", ""], v.map((x) => h("tr", {}, h("td", {}, x.name),
      h("td", {}, x.description || ""), h("td", {}, String(x.messages ?? "")), h("td", {}, remove(`vhost ${x.name}`, `/vhosts/${enc(x.name)}`))))));
    replace(perms, simpleTable(["User", "Vhost", "Configure", "Write", "Read", ""], p.map((x) => h("tr", {},
      h("td", {}, x.user), h("td", {}, x.vhost), h("td", {}, h("code", {}, x.configure)), h("td", {}, h("code", {}, x.write)),
      h("td", {}, h("code", {}, x.read)), h("td", {}, remove(`permissions of ${x.user} in ${x.vhost}`, `/permissions/${enc(x.vhost)}/${enc(x.user)}`))))));
  }
  const el = h("section", {}, h("h1", {}, "Users, vhosts and permissions"), slots.list,
    h("h2", {}, "Users"), users, h("h2", {}, "Virtual hosts"), vhosts, h("h2", {}, "Permissions"), perms,
    h("div", { class: "cols" }, userForm, vhostForm, permForm));
  return { el, refresh };
}
