// The sidebar: sessions from GET /api/sessions, with rename, delete, export and import.
// Opening a session is a plain navigation to /s/<id>: the page then restores it over the socket,
// the same path a reload takes, so there is one way in and it is always exercised.

import { api, getToken } from "./api.js";
import { el, relativeTime } from "./dom.js";

export class Sessions {
  constructor(root, { currentId, onError }) {
    this.root = root;
    this.list = root.querySelector('[data-testid="session-list"]');
    this.currentId = currentId;
    this.onError = onError;
    this.refreshing = null;
    this.again = false;
    root.querySelector('[data-testid="import-file"]').addEventListener("change", (e) => this.importFile(e.target));
  }

  setCurrent(id) {
    this.currentId = id;
    for (const item of this.list.children) item.toggleAttribute("aria-current", item.dataset.sessionId === id);
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

  async load() {
    try {
      const sessions = await api("/api/sessions");
      this.render(sessions);
    } catch (error) {
      this.onError(`Could not load sessions: ${error.message}`);
    }
  }

  render(sessions) {
    if (this.list.querySelector(".renaming")) return; // never clobber a title being typed
    this.list.replaceChildren(...sessions.map((s) => this.item(s)));
    if (!sessions.length) this.list.append(el("li", { class: "empty", text: "No saved sessions yet." }));
  }

  item(s) {
    const link = el(
      "a",
      { href: `/s/${encodeURIComponent(s.id)}`, class: "session-link" },
      el("span", { class: "session-title", "data-testid": "session-title", text: s.title || "Untitled" }),
      el("span", { class: "session-meta", text: [relativeTime(s.updated_at), `${s.message_count} msgs`, s.route].filter(Boolean).join(" · ") }),
    );
    const li = el("li", { class: "session-item", "data-testid": "session-item", dataset: { sessionId: s.id } }, link);
    li.toggleAttribute("aria-current", s.id === this.currentId);
    const actions = el("div", { class: "session-actions" });
    actions.append(
      el("button", { type: "button", class: "link", "data-testid": "session-rename", text: "Rename", onclick: () => this.startRename(li, s) }),
      this.exportLink(s.id, "md"),
      this.exportLink(s.id, "json"),
      el("button", { type: "button", class: "link danger", "data-testid": "session-delete", text: "Delete", onclick: (e) => this.remove(e.target, s) }),
    );
    li.append(actions);
    return li;
  }

  exportLink(id, format) {
    const href = `/api/sessions/${encodeURIComponent(id)}/export?format=${format}`;
    const link = el("a", { href, download: `meterchat-${id}.${format}`, class: "link", text: format.toUpperCase() });
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
    const input = el("input", { type: "text", class: "rename-input", "data-testid": "session-rename-input", "aria-label": "Session title" });
    input.value = s.title || "";
    li.classList.add("renaming");
    li.querySelector(".session-link").replaceWith(input);
    input.focus();
    input.select();
    let finished = false;
    const finish = async (save) => {
      if (finished) return;
      finished = true;
      li.classList.remove("renaming");
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
      else this.refresh();
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
