// REST calls to /api and the auth token they (and /ws) need when the server has one configured.
// The token lives in localStorage so a reload or a new tab does not ask again; a `?token=` in the
// page URL is taken once and removed from the address bar so it does not end up in bookmarks.

const KEY = "meterchat.token";
// What the page falls back to when the server renders no value for it (see templates/index.html).
const DEFAULTS = { subprotocol: "meterchat.v1", max_image_bytes: 5 * 1024 * 1024 };

export function pageConfig() {
  let rendered = {};
  try {
    rendered = JSON.parse(document.getElementById("page-config")?.textContent || "{}") || {};
  } catch {
    /* a template without the blob: the defaults serve */
  }
  return { ...DEFAULTS, ...rendered };
}

export function takeTokenFromUrl() {
  const url = new URL(location.href);
  const token = url.searchParams.get("token");
  if (!token) return;
  localStorage.setItem(KEY, token);
  url.searchParams.delete("token");
  history.replaceState(history.state, "", url);
}

export function getToken() {
  return localStorage.getItem(KEY) || "";
}

export function setToken(token) {
  if (token) localStorage.setItem(KEY, token);
  else localStorage.removeItem(KEY);
}

export function socketUrl() {
  const url = new URL("/ws", location.href);
  url.protocol = location.protocol === "https:" ? "wss:" : "ws:";
  return url.toString();
}

// The token travels as a WebSocket subprotocol, never in the URL (which server logs keep).
export function socketProtocols() {
  const { subprotocol } = pageConfig();
  const token = getToken();
  if (!token) return [subprotocol];
  const bytes = new TextEncoder().encode(token);
  const base64 = btoa(String.fromCharCode(...bytes));
  const encoded = base64.replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
  return [subprotocol, `bearer.${encoded}`];
}

export async function api(path, { method = "GET", body, raw = false } = {}) {
  const headers = {};
  const token = getToken();
  if (token) headers.Authorization = `Bearer ${token}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, {
    method,
    headers,
    body: body === undefined ? undefined : typeof body === "string" ? body : JSON.stringify(body),
  });
  if (!response.ok) {
    let detail = "";
    try {
      const data = await response.json();
      detail = data.message || data.error?.message || data.detail || "";
    } catch {
      /* the body was not JSON; the status says enough */
    }
    const error = new Error(detail || `${method} ${path} failed: ${response.status}`);
    error.status = response.status;
    throw error;
  }
  if (raw) return response;
  return response.status === 204 ? null : response.json();
}

// A stored image as a URL the page may show: fetched with the token, kept as a blob URL (the page's
// CSP allows blob: images), once per image for the life of the page.
const images = new Map();

export function imageSource(path) {
  if (!images.has(path)) {
    const loaded = api(path, { raw: true }).then(async (response) => URL.createObjectURL(await response.blob()));
    loaded.catch(() => images.delete(path)); // a failure may be tried again on the next draw
    images.set(path, loaded);
  }
  return images.get(path);
}
