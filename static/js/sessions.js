// The sidebar: sessions from GET /api/sessions, newest first a page at a time (more as the reader
// scrolls to "Show older chats"), grouped by day, searched by the server as the reader types (titles
// and message text), each with a small menu (rename, export, delete); and import.
// Opening a session is a plain navigation to /s/<id>: the page then restores it over the socket,
// the same path a reload takes, so there is one way in and it is always exercised.

import { api, getToken } from "./api.js";
import { el, relativeTime } from "./dom.js";

const DAY_MS = 86_400_000;
const PAGE = 50; // sessions a request asks for; one more tells whether older ones exist
const MOST = 499; // a refresh reloads what is shown, up to the API's limit (500) less the probe
const SEARCH_DELAY_MS = 250; // typing pauses this long before the server is asked

export class Sessions {
  constructor(root, { currentId, onError }) {
    this.root = root;
    this.list = root.querySelector('[data-testid="session-list"]');
    this.search = root.querySelector('[data-testid="session-search"]');
    this.currentId = currentId;
    this.onError = onError;
    this.sessions = []; // the last list the server sent; the one state the sidebar renders from
    this.query = ""; // the search that list answers
    this.renaming = null; // id of the session whose title is being typed
    this.stale = false; // a list arrived while a menu or a rename was open
    this.openMenu = null; // {button, menu} of the open row menu
    this.refreshing = null;
    this.again = false;
    this.more = false; // the server holds older sessions than the last one shown
    this.ticket = 0; // the newest list asked for: an answer to an older request is dropped
    this.loadingOlder = false;
    this.searchTimer = null;
    this.older = el("button", { type: "button", class: "session-older", "data-testid": "sessions-older", text: "Show older chats", onclick: () => this.loadOlder() });
    // Scrolling the button into view loads the next page; the button stays for keyboards. An entry
    // can arrive after the page it saw was replaced (a click scrolled the button into view, then
    // the older page pushed it down): it loads only if the button is still in view now.
    new IntersectionObserver((seen) => seen.some((e) => e.isIntersecting) && this.olderInView() && this.loadOlder()).observe(this.older);
    root.querySelector('[data-testid="import-file"]').addEventListener("change", (e) => this.importFile(e.target));
    // The server searches titles and message text (FTS5); the list shows what it answered.
    this.search.addEventListener("input", () => {
      clearTimeout(this.searchTimer);
      this.searchTimer = setTimeout(() => this.refresh(), SEARCH_DELAY_MS);
    });
    document.addEventListener("click", (event) => {
      if (this.openMenu && !this.openMenu.menu.parentElement.contains(event.target)) this.closeMenu();
    });
  }

  focusSearch() {
    this.search.focus();
    this.search.select();
  }

  setCurrent(id) {
    this.currentId = id;
    this.render();
  }

  // Coalesce bursts (session, title, done arriving together) into at most one request in flight.
  refresh() {
    if (this.refreshing) {
      this.again = true;
      return this.refreshing;
    }
    this.refreshing = this.load().finally(() => {
      this.refreshing = null;
      if (this.again) {
        this.again = false;
        this.refresh();
      }
    });
    return this.refreshing;
  }

  // The newest page, or as many as are shown for the same search: a refresh (a reply finished, a
  // title changed) keeps the older pages the reader scrolled to.
  async load() {
    const query = this.search.value.trim();
    const want = Math.min(MOST, Math.max(PAGE, query === this.query ? this.sessions.length : 0));
    const ticket = ++this.ticket;
    try {
      const found = await api(listUrl(query, null, want + 1));
      if (ticket !== this.ticket) return;
      this.more = found.length > want;
      this.sessions = found.slice(0, want);
      this.query = query;
      this.render();
    } catch (error) {
      this.onError(`Could not load sessions: ${error.message}`);
    }
  }

  // The next page, older than the last session shown (same search).
  async loadOlder() {
    if (!this.more || this.loadingOlder || !this.sessions.length) return;
    const ticket = this.ticket;
    this.loadingOlder = true;
    this.older.textContent = "Loading older chats…";
    try {
      const found = await api(listUrl(this.query, this.sessions[this.sessions.length - 1], PAGE + 1));
      if (ticket !== this.ticket) return; // a refresh or a new search answered meanwhile
      const shown = new Set(this.sessions.map((s) => s.id));
      this.sessions.push(...found.slice(0, PAGE).filter((s) => !shown.has(s.id)));
      this.more = found.length > PAGE;
      this.render();
    } catch (error) {
      this.onError(`Could not load older sessions: ${error.message}`);
    } finally {
      this.loadingOlder = false;
      this.older.textContent = "Show older chats";
    }
    if (ticket === this.ticket && this.olderInView()) this.loadOlder(); // a tall sidebar: keep filling it
  }

  olderInView() {
    if (!this.older.isConnected) return false;
    const button = this.older.getBoundingClientRect();
    const list = this.list.getBoundingClientRect();
    return list.height > 0 && button.top < list.bottom && button.bottom > list.top;
  }

  render() {
    // Never clobber a title being typed or a menu in use; the list catches up when they close.
    this.stale = Boolean(this.renaming || this.openMenu);
    if (this.stale) return;
    const shown = this.sessions;
    const groups = groupByDay(shown);
    this.list.replaceChildren(
      ...groups.map(([label, items]) =>
        el(
          "section",
          { class: "session-group", "data-testid": "session-group", "aria-label": label },
          el("h2", { class: "session-day", text: label }),
          el("ul", {}, ...items.map((s) => this.item(s))),
        ),
      ),
    );
    if (!shown.length) this.list.append(el("p", { class: "empty", text: this.query ? "No chat matches." : "No saved sessions yet." }));
    if (this.more) this.list.append(this.older);
  }

  item(s) {
    const count = `${s.message_count} message${s.message_count === 1 ? "" : "s"}`;
    const link = el(
      "a",
      { href: `/s/${encodeURIComponent(s.id)}`, class: "session-link" },
      el("span", { class: "session-title", "data-testid": "session-title", text: s.title || "Untitled" }),
      el("span", { class: "session-meta", "data-testid": "session-meta", text: [relativeTime(s.updated_at), count, s.route].filter(Boolean).join(" · ") }),
    );
    if (s.id === this.currentId) link.setAttribute("aria-current", "page");
    const li = el("li", { class: "session-item", "data-testid": "session-item", dataset: { sessionId: s.id } }, link);
    li.append(this.menu(s, li));
    li.toggleAttribute("aria-current", s.id === this.currentId);
    return li;
  }

  menu(s, li) {
    const wrap = el("div", { class: "session-menu-wrap" });
    const menu = el("div", { class: "session-menu", role: "menu", "data-testid": "session-menu", hidden: true });
    const button = el("button", {
      type: "button", class: "icon session-menu-button", "data-testid": "session-menu-button",
      "aria-haspopup": "menu", "aria-expanded": "false", "aria-label": `Actions for ${s.title || "Untitled"}`, text: "⋯",
    });
    button.addEventListener("click", (event) => {
      event.stopPropagation();
      if (this.openMenu?.menu === menu) this.closeMenu();
      else this.showMenu(button, menu);
    });
    menu.addEventListener("keydown", (event) => this.menuKey(event, menu, button));
    const item = (attrs) => el("button", { type: "button", role: "menuitem", class: "menu-item", ...attrs });
    menu.append(
      item({ "data-testid": "session-rename", text: "Rename", onclick: () => this.startRename(li, s) }),
      this.exportLink(s.id, "md", "Export Markdown"),
      this.exportLink(s.id, "json", "Export JSON"),
      item({ class: "menu-item danger", "data-testid": "session-delete", text: "Delete", onclick: (e) => this.remove(e.currentTarget, s) }),
    );
    wrap.append(button, menu);
    return wrap;
  }

  showMenu(button, menu) {
    this.closeMenu();
    menu.hidden = false;
    button.setAttribute("aria-expanded", "true");
    this.openMenu = { button, menu };
    menu.querySelector('[role="menuitem"]').focus();
  }

  closeMenu() {
    if (!this.openMenu) return;
    this.openMenu.menu.hidden = true;
    this.openMenu.button.setAttribute("aria-expanded", "false");
    this.openMenu = null;
    if (this.stale) this.render();
  }

  menuKey(event, menu, button) {
    const items = [...menu.querySelectorAll('[role="menuitem"]')];
    const at = items.indexOf(document.activeElement);
    if (event.key === "Escape") {
      this.closeMenu();
      button.focus();
    } else if (event.key === "ArrowDown" || event.key === "ArrowUp") {
      event.preventDefault();
      const step = event.key === "ArrowDown" ? 1 : -1;
      items[(at + step + items.length) % items.length].focus();
    }
  }

  exportLink(id, format, label) {
    const href = `/api/sessions/${encodeURIComponent(id)}/export?format=${format}`;
    const link = el("a", { href, role: "menuitem", class: "menu-item", download: `meterchat-${id}.${format}`, text: label });
    // A plain link cannot send the bearer header; with a token, fetch and hand over a blob instead.
    link.addEventListener("click", async (event) => {
      if (!getToken()) return;
      event.preventDefault();
      try {
        const blob = await (await api(href, { raw: true })).blob();
        const url = URL.createObjectURL(blob);
        el("a", { href: url, download: link.getAttribute("download") }).click();
        setTimeout(() => URL.revokeObjectURL(url), 10_000);
      } catch (error) {
        this.onError(`Export failed: ${error.message}`);
      }
    });
    return link;
  }

  startRename(li, s) {
    this.renaming = s.id; // first: closing the menu must not re-render the row being edited
    this.closeMenu();
    const input = el("input", { type: "text", class: "rename-input", "data-testid": "session-rename-input", "aria-label": "Session title" });
    input.value = s.title || "";
    li.querySelector(".session-link").replaceWith(input);
    input.focus();
    input.select();
    let finished = false;
    const finish = async (save) => {
      if (finished) return;
      finished = true;
      this.renaming = null;
      const title = input.value.trim();
      if (save && title && title !== s.title) {
        try {
          await api(`/api/sessions/${encodeURIComponent(s.id)}`, { method: "PATCH", body: { title } });
        } catch (error) {
          this.onError(`Rename failed: ${error.message}`);
        }
      }
      this.refresh();
    };
    input.addEventListener("keydown", (e) => {
      if (e.key === "Enter") finish(true);
      else if (e.key === "Escape") finish(false);
    });
    input.addEventListener("blur", () => finish(true));
  }

  async remove(button, s) {
    // Two clicks instead of confirm(): a modal dialog would block the socket's event loop too.
    if (button.dataset.armed !== "true") {
      button.dataset.armed = "true";
      button.textContent = "Really delete?";
      setTimeout(() => {
        button.dataset.armed = "false";
        button.textContent = "Delete";
      }, 4000);
      return;
    }
    try {
      await api(`/api/sessions/${encodeURIComponent(s.id)}`, { method: "DELETE" });
      if (s.id === this.currentId) location.assign("/");
      else {
        this.closeMenu();
        this.refresh();
      }
    } catch (error) {
      this.onError(`Delete failed: ${error.message}`);
    }
  }

  async importFile(input) {
    const file = input.files?.[0];
    input.value = "";
    if (!file) return;
    try {
      const text = await file.text();
      JSON.parse(text); // fail here, with a clear message, on a file that is not an export
      const { session_id } = await api("/api/sessions/import", { method: "POST", body: text });
      location.assign(`/s/${encodeURIComponent(session_id)}`);
    } catch (error) {
      this.onError(`Import failed: ${error.message}`);
    }
  }
}

// [label, sessions] for Today, Yesterday and Earlier, in that order, empty groups left out.
export function groupByDay(sessions, now = new Date()) {
  const midnight = new Date(now.getFullYear(), now.getMonth(), now.getDate()).getTime();
  const groups = { Today: [], Yesterday: [], Earlier: [] };
  for (const s of sessions) {
    const when = toMillis(s.updated_at);
    const label = when >= midnight ? "Today" : when >= midnight - DAY_MS ? "Yesterday" : "Earlier";
    groups[label].push(s);
  }
  return Object.entries(groups).filter(([, items]) => items.length);
}

// `after`: the last session shown; the next page starts past it in the list's order (time, then id).
function listUrl(query, after, limit) {
  const params = new URLSearchParams({ limit: String(limit) });
  if (query) params.set("q", query);
  if (after) {
    params.set("before", after.updated_at);
    params.set("before_id", after.id);
  }
  return `/api/sessions?${params}`;
}

function toMillis(value) {
  if (typeof value === "number") return value * (value < 1e12 ? 1000 : 1);
  const parsed = Date.parse(value);
  return Number.isFinite(parsed) ? parsed : 0;
}
