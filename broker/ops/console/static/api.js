// The console's only way to the broker: the public HTTP API, with the logged-in user's basic auth.
const KEY = "warren.credentials";

export class ApiError extends Error {
  constructor(status, error, reason) {
    super(reason || error || `HTTP ${status}`);
    this.status = status;
    this.error = error;
  }
}

export function credentials() {
  try { return JSON.parse(sessionStorage.getItem(KEY) || "null"); } catch { return null; }
}

export function saveCredentials(username, password) {
  sessionStorage.setItem(KEY, JSON.stringify({ username, password }));
}

export function forget() { sessionStorage.removeItem(KEY); }

// "/" is the default vhost; every path segment is encoded, as RabbitMQ's URLs expect
export const enc = (name) => encodeURIComponent(name);

function authHeader(creds) {
  const bytes = new TextEncoder().encode(`${creds.username}:${creds.password}`);
  let text = "";
  for (const b of bytes) text += String.fromCharCode(b);
  return "Basic " + btoa(text);
}

function reasonText(reason) {
  if (typeof reason === "string") return reason.trim();
  return JSON.stringify(reason);
}

export async function api(method, path, body, { creds = credentials(), headers = {} } = {}) {
  if (!creds) throw new ApiError(401, "not_authorized", "Not logged in");
  // X-Requested-With: the API then answers 401 without a Basic challenge (no browser prompt)
  const init = { method, headers: { Authorization: authHeader(creds), "X-Requested-With": "XMLHttpRequest", ...headers } };
  // the API refuses a POST, or any body, that is not declared JSON (cross-site requests)
  if (method !== "GET" && method !== "HEAD") init.headers["Content-Type"] = "application/json";
  if (body !== undefined) init.body = JSON.stringify(body);
  let resp;
  try {
    resp = await fetch("/api" + path, init);
  } catch (err) {
    throw new ApiError(0, "network", `The broker did not answer (${err.message})`);
  }
  const text = await resp.text();
  let data = null;
  if (text) {
    try { data = JSON.parse(text); } catch { data = text; }
  }
  if (!resp.ok) {
    const error = data && data.error;
    const reason = data && data.reason !== undefined ? reasonText(data.reason) : (typeof data === "string" ? data : "");
    throw new ApiError(resp.status, error, `${resp.status} ${error || resp.statusText}: ${reason}`.trim());
  }
  return data;
}

// A list page as RabbitMQ paginates it: {items, page, page_count, filtered_count, total_count}
export function listPage(path, { page = 1, pageSize = 50, name = "", regex = false, sort = "", reverse = false, columns = "" } = {}) {
  const q = new URLSearchParams({ page: String(page), page_size: String(pageSize) });
  if (name) q.set("name", name);
  if (name && regex) q.set("use_regex", "true");
  if (sort) q.set("sort", sort);
  if (reverse) q.set("sort_reverse", "true");
  if (columns) q.set("columns", columns);
  return api("GET", `${path}?${q}`);
}
