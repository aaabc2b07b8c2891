// The input area: text box (Enter sends, Shift+Enter breaks the line), image attachments, Send and
// Stop, the model picker and the trim preview that warns before a send drops turns. Handlers come in
// through bind(event, handler) (send, stop, switch, editLast, editEnd); state through render(command, value).

import { el, fmt } from "./dom.js";

// What is typed and not sent yet outlives a reload: per session in localStorage, until it is sent.
// Send waits while a reply streams, so a reader often types ahead; a reload must not lose that.
const DRAFTS = "meterchat.drafts";
const MAX_DRAFTS = 20; // the newest sessions' drafts; older ones are dropped
const MAX_DRAFT_CHARS = 100_000;

export class Composer {
  constructor(root, { maxImageBytes }) {
    this.q = (id) => root.querySelector(`[data-testid="${id}"]`);
    this.input = this.q("message-input");
    this.sendButton = this.q("send");
    this.stopButton = this.q("stop");
    this.picker = this.q("model-picker");
    this.preview = this.q("trim-preview");
    this.note = this.q("edit-note");
    this.maxImageBytes = maxImageBytes;
    this.attachments = [];
    this.editing = null; // the turn a send replaces (retry_of), while the reader edits it
    this.connected = false;
    this.streaming = false;
    this.handlers = {};
    const onSend = (...args) => this.handlers.send?.(...args);
    const onStop = () => this.handlers.stop?.();
    const onSwitch = (route) => this.handlers.switch?.(route);
    const onEditLast = () => this.handlers.editLast?.();

    root.querySelector("form").addEventListener("submit", (event) => {
      event.preventDefault();
      this.submit(onSend);
    });
    this.input.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
        event.preventDefault();
        this.submit(onSend);
      } else if (event.key === "Escape" && this.streaming) {
        event.preventDefault();
        onStop();
      } else if (event.key === "Escape" && this.editing) {
        event.preventDefault();
        this.cancelEdit();
      } else if (event.key === "ArrowUp" && !this.input.value && !this.streaming && !event.shiftKey) {
        event.preventDefault();
        onEditLast();
      }
    });
    this.q("edit-cancel").addEventListener("click", () => this.cancelEdit());
    this.input.addEventListener("input", () => {
      this.autosize();
      this.saveDraft();
    });
    this.stopButton.addEventListener("click", () => onStop());
    this.picker.addEventListener("change", () => onSwitch(this.picker.value));
    this.q("attach-input").addEventListener("change", (event) => this.attach(event.target));
  }

  bind(event, handler) {
    this.handlers[event] = handler;
  }

  render(command, value) {
    const commands = {
      connected: () => this.setConnected(value),
      streaming: () => this.setStreaming(value),
      routes: () => this.setRoutes(value.routes, value.current),
      route: () => this.showRoute(value.provider, value.model),
      trimPreview: () => this.setTrimPreview(value),
      edit: () => this.edit(value.text, value.turnId, value.later || 0),
      draft: () => this.restoreDraft(value),
    };
    commands[command]();
  }

  submit(onSend) {
    const content = this.input.value.trim();
    if (!content && !this.attachments.length) return;
    // The server runs one reply per session at a time; Stop first, then send.
    if (!this.connected || this.streaming) return;
    const images = this.attachments;
    if (onSend(content, images, this.editing) === false) return;
    const edited = this.editing;
    this.setEditing(null);
    if (edited) this.input.value = readDrafts()[this.draftKey]?.text || ""; // the draft an edit set aside
    else {
      this.input.value = "";
      this.saveDraft();
    }
    this.attachments = [];
    this.renderAttachments();
    this.autosize();
  }

  // The session whose draft the box keeps: its saved draft comes back unless something is typed.
  restoreDraft(sessionId) {
    this.draftKey = sessionId;
    const saved = readDrafts()[sessionId];
    if (saved && !this.input.value && !this.editing) {
      this.input.value = saved.text;
      this.autosize();
    }
  }

  saveDraft() {
    if (!this.draftKey || this.editing) return; // an edit's text is the sent message, not a draft
    const drafts = readDrafts();
    delete drafts[this.draftKey];
    const text = this.input.value.slice(0, MAX_DRAFT_CHARS);
    if (text.trim()) drafts[this.draftKey] = { text, at: Date.now() };
    const newest = Object.entries(drafts).sort((a, b) => b[1].at - a[1].at).slice(0, MAX_DRAFTS);
    try {
      if (newest.length) localStorage.setItem(DRAFTS, JSON.stringify(Object.fromEntries(newest)));
      else localStorage.removeItem(DRAFTS);
    } catch {
      // Storage full or refused (a private window): the draft lives only in the box, as before.
    }
  }

  // Puts a sent message back in the box; sending it replaces that turn (and the `later` turns after it).
  edit(text, turnId, later = 0) {
    this.input.value = text;
    this.setEditing(turnId);
    const after = later ? ` and the ${later === 1 ? "turn" : `${later} turns`} after it` : " and its reply";
    // The meter shows the edit's preview meanwhile (app.js asks for it): say so, or it looks like a drop.
    this.note.firstChild.textContent = `Editing ${later ? "an earlier" : "your last"} message: sending replaces it${after}; the meter shows what would remain. `;
    this.autosize();
    this.input.focus();
    this.input.setSelectionRange(text.length, text.length);
  }

  cancelEdit() {
    this.setEditing(null);
    this.input.value = readDrafts()[this.draftKey]?.text || ""; // back to what was typed before the edit
    this.autosize();
  }

  setEditing(turnId) {
    const ended = this.editing && !turnId;
    this.editing = turnId || null;
    this.note.hidden = !this.editing;
    if (ended) this.handlers.editEnd?.(); // the meter leaves the edit's preview
  }

  focus() {
    this.input.focus();
  }

  autosize() {
    this.input.style.height = "auto";
    this.input.style.height = `${Math.min(this.input.scrollHeight, 240)}px`;
  }

  setConnected(connected) {
    this.connected = connected;
    this.updateButtons();
  }

  setStreaming(streaming) {
    this.streaming = streaming;
    this.updateButtons();
  }

  updateButtons() {
    this.sendButton.disabled = !this.connected || this.streaming;
    this.stopButton.disabled = !(this.connected && this.streaming);
    this.picker.disabled = !this.connected;
  }

  setRoutes(routes, current) {
    const options = [...new Set([...(routes || []), current].filter(Boolean))];
    this.picker.replaceChildren(...options.map((r) => el("option", { value: r, text: r })));
    if (current) this.picker.value = current;
  }

  // Follow the session's route, choosing the most specific option the picker has.
  showRoute(provider, model) {
    const candidates = [model ? `${provider}/${model}` : null, provider];
    for (const candidate of candidates) {
      if ([...this.picker.options].some((o) => o.value === candidate)) {
        this.picker.value = candidate;
        return;
      }
    }
  }

  setTrimPreview(preview) {
    if (!preview || !(preview.turns > 0)) {
      this.preview.hidden = true;
      this.preview.textContent = "";
      return;
    }
    const turns = `${fmt(preview.turns)} turn${preview.turns === 1 ? "" : "s"}`;
    this.preview.textContent = `Next send will trim ${turns}, ~${fmt(preview.tokens)} tokens, to fit the budget.`;
    this.preview.hidden = false;
  }

  async attach(input) {
    const files = [...(input.files || [])];
    input.value = "";
    for (const file of files) {
      if (!file.type.startsWith("image/")) continue;
      if (file.size > this.maxImageBytes) {
        const mb = (this.maxImageBytes / 1024 / 1024).toFixed(1).replace(/\.0$/, "");
        this.q("attach-error").textContent = `${file.name} is larger than ${mb} MB and was not attached.`;
        continue;
      }
      const dataUrl = await readAsDataUrl(file);
      this.attachments.push({ media_type: file.type, data: dataUrl.slice(dataUrl.indexOf(",") + 1), dataUrl });
    }
    this.renderAttachments();
  }

  renderAttachments() {
    const strip = this.q("attachments");
    strip.replaceChildren(
      ...this.attachments.map((image, index) =>
        el(
          "span",
          { class: "attachment" },
          el("img", { src: image.dataUrl, alt: "attachment preview" }),
          el("button", {
            type: "button",
            class: "remove",
            "aria-label": "Remove image",
            text: "×",
            onclick: () => {
              this.attachments.splice(index, 1);
              this.renderAttachments();
            },
          }),
        ),
      ),
    );
    strip.hidden = this.attachments.length === 0;
    if (!this.attachments.length) this.q("attach-error").textContent = "";
  }
}

function readDrafts() {
  try {
    const drafts = JSON.parse(localStorage.getItem(DRAFTS) || "{}");
    return drafts && typeof drafts === "object" && !Array.isArray(drafts) ? drafts : {};
  } catch {
    return {};
  }
}

export function forgetDrafts() {
  localStorage.removeItem(DRAFTS);
}

function readAsDataUrl(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}
