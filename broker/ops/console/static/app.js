// The console's shell: login, navigation by URL hash, theme, and the polling loop.
import { api, credentials, forget, saveCredentials } from "./api.js";
import { h, replace } from "./ui.js";
import * as pages from "./pages.js";
import * as admin from "./admin.js";

const params = new URLSearchParams(location.search);
const POLL_MS = Math.max(500, Number(params.get("refresh")) || 5000);

const ROUTES = [
  { path: "overview", title: "Overview", page: pages.overview },
  { path: "queues", title: "Queues", page: pages.queues },
  { path: "exchanges", title: "Exchanges", page: pages.exchanges },
  { path: "connections", title: "Connections", page: pages.connections },
  { path: "channels", title: "Channels", page: pages.channels },
  { path: "policies", title: "Policies", page: admin.policies },
  { path: "admin", title: "Admin", page: admin.adminPage, adminOnly: true },
];
const DETAILS = { queue: pages.queue, exchange: pages.exchange };

const main = document.getElementById("main");
const nav = document.getElementById("nav");
const banner = document.getElementById("banner");
const menu = document.getElementById("menu");
let user = null;
let current = null;
let polling = false;

function applyTheme(theme) {
  if (theme) document.documentElement.dataset.theme = theme;
  else delete document.documentElement.dataset.theme;
}
applyTheme(localStorage.getItem("warren.theme"));
document.getElementById("theme").addEventListener("click", () => {
  const dark = document.documentElement.dataset.theme
    ? document.documentElement.dataset.theme === "dark"
    : matchMedia("(prefers-color-scheme: dark)").matches;
  const next = dark ? "light" : "dark";
  localStorage.setItem("warren.theme", next);
  applyTheme(next);
});
menu.addEventListener("click", () => {
  const open = nav.classList.toggle("open");
  menu.setAttribute("aria-expanded", String(open));
});
document.getElementById("logout").addEventListener("click", () => {
  forget();
  user = null;
  location.hash = "#/";
  showLogin();
});

function showLogin(message) {
  current = null;
  nav.replaceChildren();
  menu.hidden = true;
  document.getElementById("logout").hidden = true;
  document.getElementById("who").textContent = "";
  const form = document.getElementById("login-template").content.firstElementChild.cloneNode(true);
  const error = form.querySelector("[data-role=error]");
  if (message) { error.hidden = false; error.textContent = message; }
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const creds = { username: form.username.value, password: form.password.value };
    try {
      const me = await api("GET", "/whoami", undefined, { creds });
      saveCredentials(creds.username, creds.password);
      start(me);
    } catch (err) {
      error.hidden = false;
      // the API's own 401 text repeats "Login failed": say it once, in plain words
      error.textContent = err.status === 401 ? "Login failed: wrong username or password." : err.message;
    }
  });
  replace(main, form);
  form.username.focus();
}

function start(me) {
  const tags = Array.isArray(me.tags) ? me.tags : String(me.tags || "").split(",");
  user = {
    name: me.name,
    tags,
    isAdmin: tags.includes("administrator"),
    canPolicy: tags.includes("administrator") || tags.includes("policymaker"),
  };
  document.getElementById("who").textContent = `${user.name} (${tags.join(", ") || "no tags"})`;
  document.getElementById("logout").hidden = false;
  menu.hidden = false;
  route();
}

function route() {
  if (!user) return;
  const parts = location.hash.replace(/^#\/?/, "").replace(/\/+$/, "").split("/").map(decodeURIComponent);
  const [name, ...rest] = parts;
  const visible = ROUTES.filter((r) => !r.adminOnly || user.isAdmin);
  replace(nav, visible.map((r) => h("a", {
    href: `#/${r.path}`,
    class: (name || "overview") === r.path || (DETAILS[name] && `${name}s` === r.path) ? "active" : "",
    onclick: () => { nav.classList.remove("open"); menu.setAttribute("aria-expanded", "false"); },
  }, r.title)));
  const ctx = { user, params: rest, poll: POLL_MS };
  // a deep link that names no page says so, rather than showing another page in its place
  const listed = visible.find((r) => r.path === (name || "overview"));
  let page;
  if (DETAILS[name] && rest.length === 2) page = DETAILS[name](ctx);
  else if (listed && rest.length === 0) page = listed.page(ctx);
  else page = notFound(location.hash);
  current = page;
  banner.hidden = true;
  replace(main, page.el);
  refresh(page);
}

function notFound(hash) {
  return {
    el: h("section", { dataset: { role: "not-found" } },
      h("h1", {}, "Not found"),
      h("p", {}, "The console has no page at ", h("code", {}, hash || "#/"), "."),
      h("p", {}, h("a", { href: "#/overview" }, "Overview"), " \u00b7 ", h("a", { href: "#/queues" }, "Queues"))),
    refresh: async () => {},
  };
}

async function refresh(page) {
  if (polling || page !== current) return;
  polling = true;
  try {
    await page.refresh();
    banner.hidden = true;
  } catch (err) {
    if (err.status === 401 && !credentials()) return showLogin();
    banner.hidden = false;
    banner.textContent = `Could not refresh: ${err.message}`;
  } finally {
    polling = false;
  }
}

window.addEventListener("hashchange", route);
setInterval(() => { if (current && !document.hidden) refresh(current); }, POLL_MS);

(async () => {
  const creds = credentials();
  if (!creds) return showLogin();
  try {
    start(await api("GET", "/whoami"));
  } catch (err) {
    forget();
    showLogin(err.status === 401 ? "Please log in again." : err.message);
  }
})();
