// Small DOM and formatting helpers shared by the page modules. Everything that shows text from the
// server or the model goes through textContent here; only markdown.js writes HTML, after sanitising.

const numberFormat = new Intl.NumberFormat("en-US");

export function fmt(n) {
  return typeof n === "number" && Number.isFinite(n) ? numberFormat.format(Math.round(n)) : "?";
}

// el("div", {class: "x", dataset: {role: "user"}}, "text", child) -> HTMLElement
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "dataset") {
      for (const [name, v] of Object.entries(value)) if (v !== undefined && v !== null) node.dataset[name] = v;
    }
    else if (key === "text") node.textContent = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

export function uuid() {
  if (crypto.randomUUID) return crypto.randomUUID();
  // randomUUID needs a secure context; plain-http LAN hosts still deserve unique ids.
  const b = crypto.getRandomValues(new Uint8Array(16));
  b[6] = (b[6] & 0x0f) | 0x40;
  b[8] = (b[8] & 0x3f) | 0x80;
  const h = [...b].map((x) => x.toString(16).padStart(2, "0")).join("");
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
}

export function routeLabel(provider, model) {
  return model ? `${provider}/${model}` : provider || "";
}

export function relativeTime(value) {
  const then = typeof value === "number" ? value * (value < 1e12 ? 1000 : 1) : Date.parse(value);
  if (!Number.isFinite(then)) return "";
  const seconds = Math.max(0, (Date.now() - then) / 1000);
  if (seconds < 60) return "just now";
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min ago`;
  if (seconds < 86400) return `${Math.floor(seconds / 3600)} h ago`;
  return new Date(then).toLocaleDateString();
}

export async function copyText(text) {
  try {
    await navigator.clipboard.writeText(text);
    return true;
  } catch {
    // Clipboard API is missing on plain-http origins; fall back to a hidden textarea.
    const area = el("textarea", { class: "offscreen", "aria-hidden": "true" });
    area.value = text;
    document.body.append(area);
    area.select();
    const ok = document.execCommand("copy");
    area.remove();
    return ok;
  }
}
