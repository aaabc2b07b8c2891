// The conversation column, a view of the Transcript model. It owns the DOM and hides it behind
// bind(event, handler) and render(change, item). Nodes carry data-* attributes written from the
// items for the CSS and the browser tests; nothing here reads them back.

import { imageSource } from "./api.js";
import { el, fmt } from "./dom.js";
import { flushRenders, renderNow, scheduleRender } from "./markdown.js";

const TRIM_REASONS = {
  token_budget: "to fit the context window",
  turn_limit: "to stay within the turn limit",
  overflow_recovery: "after the provider said the context was full",
  compaction: "by compaction",
};
const PIN_GAP = 240; // px from the bottom within which the reader counts as following the stream

export class ConversationView {
  constructor(root, scrollButton) {
    this.root = root;
    this.scrollButton = scrollButton;
    this.nodes = new Map(); // item key -> the node placed in the column (a row for messages)
    this.inner = new Map(); // item key -> the message node itself
    this.rendered = new Map(); // item key -> the text its body shows
    this.toolSignatures = new WeakMap(); // tools box -> the calls it shows
    this.openTools = new Set(); // ids of the tool calls the reader opened
    this.versionShown = new Map(); // item key -> the "i/n" its version pager shows
    this.handlers = {};
    this.lastUserKey = null;
    this.lastReplyKey = null;
    this.streaming = false;
    this.pinQueued = false;
    root.addEventListener("scroll", () => this.updateScrollButton(), { passive: true });
    scrollButton.addEventListener("click", () => this.scrollToBottom());
  }

  bind(event, handler) {
    this.handlers[event] = handler;
  }

  render(change, subject, extra) {
    if (change === "reset") return this.reset(subject);
    if (change === "prepend") return this.prepend(subject);
    if (change === "older") return this.showOlder(subject);
    if (change === "add") return this.insert(subject, extra);
    if (change === "update") return this.update(subject);
    if (change === "last") return this.markLast(subject);
    if (change === "streaming") return this.setStreaming(subject);
  }

  reset(items) {
    this.root.replaceChildren();
    this.nodes.clear();
    this.inner.clear();
    this.rendered.clear();
    for (const entry of items) this.root.append(this.build(entry));
    flushRenders();
    this.scrollToBottom();
  }

  // An older page: placed above what is shown, the reader's view held where it was.
  prepend(items) {
    const height = this.root.scrollHeight;
    const first = this.olderButton?.isConnected ? this.olderButton.nextSibling : this.root.firstChild;
    for (const entry of items) this.root.insertBefore(this.build(entry), first);
    flushRenders();
    this.root.scrollTop += this.root.scrollHeight - height;
  }

  // The "Load older messages" button heads the column while the server holds older messages.
  showOlder(count) {
    if (!this.olderButton) {
      this.olderButton = document.createElement("button");
      this.olderButton.type = "button";
      this.olderButton.className = "older";
      this.olderButton.dataset.testid = "load-older";
      this.olderButton.addEventListener("click", () => this.handlers.older?.());
    }
    this.olderButton.textContent = `Load older messages (${count.toLocaleString()})`;
    if (count > 0) this.root.prepend(this.olderButton);
    else this.olderButton.remove();
  }

  insert(entry, before) {
    const nearBottom = this.gap() < 80; // never yank a reader away from old text
    const node = this.build(entry);
    const anchor = before ? this.nodes.get(before.key) : null;
    if (anchor) anchor.before(node);
    else this.root.append(node);
    if (entry.kind === "user" && entry.state === "pending") this.scrollToBottom(); // the reader just sent it
    else if (nearBottom || (anchor && this.gap() < PIN_GAP)) this.root.scrollTop = this.root.scrollHeight;
  }

  update(entry) {
    const node = this.inner.get(entry.key);
    if (!node) return;
    this.decorate(node, entry);
    if (entry.kind === "assistant") this.fillReply(node, entry);
    if (entry.kind === "user") this.fillUser(node, entry);
    fillTime(this.nodes.get(entry.key), entry.time);
    this.queuePin();
  }

  // ----- building nodes -----

  build(entry) {
    const node = BUILDERS[entry.kind](entry);
    this.inner.set(entry.key, node);
    this.decorate(node, entry);
    if (entry.kind === "assistant") this.fillReply(node, entry);
    // Actions sit beside the message, not in it: the message's text stays exactly its content.
    const placed = entry.kind === "user" || entry.kind === "assistant" ? el("div", { class: `msg-row ${entry.kind}` }, node, this.actions(entry)) : node;
    this.nodes.set(entry.key, placed);
    placed.hidden = Boolean(entry.versionHidden);
    fillTime(placed, entry.time);
    return placed;
  }

  decorate(node, entry) {
    const placed = this.nodes.get(entry.key);
    if (placed) placed.hidden = Boolean(entry.versionHidden);
    const d = node.dataset;
    setData(d, "role", entry.role);
    setData(d, "state", entry.state);
    setData(d, "turnId", entry.turnId);
    setData(d, "messageId", entry.messageId);
    setData(d, "clientId", entry.clientId);
    setData(d, "trimmed", entry.trimmed ? "true" : null);
    setData(d, "excluded", entry.excluded);
    if (entry.trimmed) node.title = "Trimmed: no longer sent to the model";
    else if (entry.excluded) node.title = `${capital(entry.excluded)}: no longer sent to the model`;
  }

  // A sent message shows the text the server kept (a /hint prefix taken off).
  fillUser(node, entry) {
    const body = node.querySelector(".msg-body");
    if (body.textContent !== entry.text) body.textContent = entry.text;
  }

  fillReply(node, entry) {
    const route = node.querySelector(".route");
    route.textContent = entry.route || "";
    if (entry.routeTitle) route.title = entry.routeTitle;
    const thinking = node.querySelector(".thinking");
    thinking.hidden = !entry.thinking;
    thinking.querySelector(".thinking-text").textContent = entry.thinking || "";
    this.fillTools(node.querySelector(".tools"), entry.tools || []);
    this.fillVersions(node.querySelector(".versions"), entry);
    node.querySelector(".msg-foot").textContent = entry.foot || "";
    const body = node.querySelector(".msg-body");
    if (this.rendered.get(entry.key) === entry.text) {
      // A reply that ends (done, stopped) with the text it had shows it now, not a frame later.
      if (entry.state !== "streaming") flushRenders();
      return;
    }
    this.rendered.set(entry.key, entry.text);
    // While a reply streams, renders are batched to one per animation frame; once it ends, now.
    if (entry.state === "streaming") scheduleRender(body, () => entry.text);
    else if (entry.text || body.childNodes.length) renderNow(body, entry.text);
  }

  fillTools(box, tools) {
    // Rebuilt only when a call starts or ends, so a tool the reader opened stays open as text streams.
    const signature = tools.map((t) => `${t.id}:${t.state}`).join(",");
    if (this.toolSignatures.get(box) === signature) return;
    this.toolSignatures.set(box, signature);
    box.replaceChildren(...tools.map((call) => toolCallNode(call, this.openTools, this.handlers)));
  }

  fillVersions(box, entry) {
    const v = entry.version;
    const label = v && v.count > 1 ? `${v.index} / ${v.count}` : "";
    if (this.versionShown.get(entry.key) === label) return;
    this.versionShown.set(entry.key, label);
    box.replaceChildren();
    if (!label) return;
    const flip = (step, text, name, disabled) =>
      el("button", { type: "button", class: "act", "aria-label": name, disabled, text, onclick: () => this.handlers.flip?.(entry, step) });
    box.append(
      flip(-1, "‹", "Previous version", v.index === 1),
      el("span", { "data-testid": "version-label", text: label }),
      flip(1, "›", "Next version", v.index === v.count),
    );
  }

  actions(entry) {
    const bar = el("div", { class: "msg-actions", role: "group", "aria-label": "Message actions" });
    const copy = el("button", { type: "button", class: "act", "data-testid": "copy-message", text: "Copy" });
    copy.addEventListener("click", async () => {
      const ok = await this.handlers.copy?.(entry);
      copy.textContent = ok ? "Copied" : "Copy failed";
      setTimeout(() => (copy.textContent = "Copy"), 1500);
    });
    bar.append(copy);
    const act = (testid, text, handler) =>
      el("button", { type: "button", class: "act only-last", "data-testid": testid, text, onclick: () => this.handlers[handler]?.(entry) });
    // Any sent message can be edited: the turns after it leave the context (the meter previews it).
    if (entry.kind === "user") bar.append(el("button", { type: "button", class: "act edit-any", "data-testid": "edit-message", text: "Edit", onclick: () => this.handlers.edit?.(entry) }));
    if (entry.kind === "assistant") bar.append(act("regenerate", "Regenerate", "regenerate"));
    bar.append(el("time", { class: "msg-time", "data-testid": "message-time" }));
    return bar;
  }

  // Regenerate is offered on the last reply only: `retry_of` replaces one turn, the last.
  markLast({ user, reply }) {
    this.swapLast("lastUserKey", user);
    this.swapLast("lastReplyKey", reply);
    this.queuePin(); // the last rows' actions appear: a reader at the bottom stays there
  }

  swapLast(field, entry) {
    const old = this.nodes.get(this[field]);
    if (old) old.classList.remove("is-last");
    this[field] = entry ? entry.key : null;
    const node = entry ? this.nodes.get(entry.key) : null;
    if (node) node.classList.add("is-last");
  }

  // ----- scrolling -----

  gap() {
    return this.root.scrollHeight - this.root.scrollTop - this.root.clientHeight;
  }

  queuePin() {
    if (this.pinQueued) return;
    this.pinQueued = true;
    requestAnimationFrame(() => {
      this.pinQueued = false;
      if (this.gap() < PIN_GAP) this.root.scrollTop = this.root.scrollHeight;
      this.updateScrollButton();
    });
  }

  scrollToBottom() {
    this.root.scrollTop = this.root.scrollHeight;
    this.updateScrollButton();
  }

  setStreaming(streaming) {
    this.streaming = streaming;
    this.updateScrollButton();
  }

  updateScrollButton() {
    // Only while a reply streams below the reader: then new text is arriving out of sight.
    this.scrollButton.hidden = !(this.streaming && this.gap() >= PIN_GAP);
  }
}

const BUILDERS = {
  user: (e) => {
    const node = el("article", { class: "msg user" }, el("div", { class: "msg-body plain", text: e.text }));
    if (e.dataUrls && e.dataUrls.length) {
      node.append(el("div", { class: "thumbs" }, ...e.dataUrls.map((src) => el("img", { src, alt: "attached image" }))));
    } else if (e.imageUrls && e.imageUrls.length) {
      node.append(el("div", { class: "thumbs" }, ...e.imageUrls.map((url) => storedImage(url))));
    } else if (e.imageCount) node.append(el("div", { class: "msg-meta", text: `${e.imageCount} image${e.imageCount === 1 ? "" : "s"} attached` }));
    return node;
  },
  assistant: () =>
    el(
      "article",
      { class: "msg assistant" },
      el("div", { class: "msg-meta" }, el("span", { class: "route", "data-testid": "reply-route" }), el("span", { class: "versions", "data-testid": "versions" })),
      el("details", { class: "thinking", hidden: true }, el("summary", { text: "Thinking" }), el("div", { class: "thinking-text" })),
      el("div", { class: "tools" }),
      el("div", { class: "msg-body markdown" }),
      el("div", { class: "msg-foot" }),
    ),
  tool: (e) => el("details", { class: "msg tool" }, el("summary", {}, "Tool result ", el("code", { text: e.name || "" })), toolOutput(e.output)),
  system: (e) => el("details", { class: "msg system" }, el("summary", { text: "System prompt" }), el("div", { class: "msg-body", text: e.text })),
  breadcrumb: (e) => el("div", { class: "msg breadcrumb", dataset: { kind: "breadcrumb" } }, el("div", { class: "msg-body", text: e.text })),
  summary: (e) =>
    el("div", { class: "msg summary", dataset: { kind: "summary" } }, el("div", { class: "msg-meta", text: "Summary of earlier turns" }), el("div", { class: "msg-body", text: e.text })),
  command: (e) => el("div", { class: "msg command", text: e.text }),
  notice: (e) => el("div", { class: `notice ${e.level}`, "data-testid": "notice", dataset: { code: e.code } }, e.text),
  trim: (e) => trimNotice(e.frame),
  error: (e) => {
    const box = el("div", { class: "notice error", "data-testid": "error", role: "alert", dataset: { code: e.code } });
    if (e.code) box.append(el("span", { class: "code", text: e.code }), " ");
    box.append(e.text);
    if (e.retry) box.append(" ", el("button", { type: "button", class: "link", "data-testid": "try-again", text: "Try again", onclick: e.retry }));
    return box;
  },
};

function trimNotice(f) {
  const turns = `${fmt(f.dropped_turns)} turn${f.dropped_turns === 1 ? "" : "s"}`;
  const msgs = `${fmt(f.dropped_messages)} message${f.dropped_messages === 1 ? "" : "s"}`;
  let text = `Earlier turns were trimmed ${TRIM_REASONS[f.reason] || `(${f.reason})`}: `;
  text += `${turns} (${msgs}) dropped, ${fmt(f.kept_turns)} kept`;
  if (typeof f.tokens_before === "number" && typeof f.tokens_after === "number") {
    text += `; ${fmt(f.tokens_before)} → ${fmt(f.tokens_after)} tokens`;
    if (typeof f.token_budget === "number" && f.token_budget > 0) text += ` of a ${fmt(f.token_budget)} budget`;
  }
  return el("div", { class: "notice trim", "data-testid": "trim-notice", dataset: { reason: f.reason } }, `${text}.`);
}

function toolCallNode(call, openTools, handlers) {
  const args = typeof call.args === "string" ? call.args : JSON.stringify(call.args ?? {}, null, 2);
  const asking = call.state === "approval";
  const node = el(
    "details",
    { class: "tool", open: asking || openTools.has(call.id), dataset: { toolCallId: call.id, state: call.state } },
    el("summary", {}, ...toolSummary(call)),
  );
  if (asking) node.append(approvalBar(call, handlers));
  node.append(el("pre", { class: "tool-args", "data-testid": "tool-args", text: args }));
  if (call.output !== undefined) node.append(toolOutput(call.output));
  node.addEventListener("toggle", () => (node.open ? openTools.add(call.id) : openTools.delete(call.id)));
  return node;
}

// An image from the store: fetched with the token (an <img src> cannot send it), shown from a blob.
function storedImage(url) {
  const img = el("img", { alt: "attached image", "data-testid": "stored-image" });
  imageSource(url).then(
    (src) => (img.src = src),
    () => img.replaceWith(el("span", { class: "msg-meta", text: "image unavailable" })),
  );
  return img;
}

// The question a call with approve = "always" waits on: these arguments, this once, or not at all.
function approvalBar(call, handlers) {
  const answer = (allow) => (event) => {
    for (const button of event.currentTarget.parentElement.querySelectorAll("button")) button.disabled = true;
    handlers.decide?.(call, allow);
  };
  return el(
    "div",
    { class: "tool-approval", role: "group", "aria-label": "Approve this tool call", "data-testid": "tool-approval" },
    el("span", { text: `Run ${call.name}${call.server ? ` on ${call.server}` : ""} with these arguments?` }),
    el("button", { type: "button", class: "primary", "data-testid": "tool-allow", text: "Allow once", onclick: answer(true) }),
    el("button", { type: "button", "data-testid": "tool-deny", text: "Deny", onclick: answer(false) }),
  );
}

// The collapsed line of a call: its tool and server, then a spinner while it runs, or what its
// result costs in tokens (and what the cap cut) once it is back.
function toolSummary(call) {
  const parts = ["Tool ", el("code", { text: call.name })];
  if (call.server) parts.push(el("span", { class: "tool-server", "data-testid": "tool-server", text: ` on ${call.server}` }));
  if (call.state === "approval") {
    parts.push(el("span", { class: "tool-size", text: " · waiting for your approval" }));
    return parts;
  }
  if (call.state === "running") {
    parts.push(el("span", { class: "spinner", role: "status", "aria-label": "running", "data-testid": "tool-spinner" }));
    return parts;
  }
  let size = typeof call.tokens === "number" ? ` · ${fmt(call.tokens)} tokens` : "";
  if (call.cut) size += ` · ${fmt(call.cut)} characters cut`;
  if (call.state === "error") size += " · error";
  if (size) parts.push(el("span", { class: "tool-size", "data-testid": "tool-size", text: size }));
  return parts;
}

function toolOutput(output) {
  const text = typeof output === "string" ? output : JSON.stringify(output, null, 2);
  return el("pre", { class: "tool-output", "data-testid": "tool-output", text });
}

function setData(dataset, name, value) {
  if (value === undefined || value === null || value === "") delete dataset[name];
  else dataset[name] = value;
}

function capital(text) {
  return text.charAt(0).toUpperCase() + text.slice(1);
}

// The hover time: the server's created_at once it is known (accepted, done, history), so a reload
// shows the same time the live page did.
function fillTime(placed, time) {
  const node = placed && placed.querySelector(":scope > .msg-actions > .msg-time");
  if (!node) return;
  node.hidden = !time;
  if (!time) return;
  const when = new Date(time);
  const stamp = when.toISOString();
  if (node.getAttribute("datetime") === stamp) return;
  node.setAttribute("datetime", stamp);
  node.title = when.toLocaleString();
  node.textContent = clock(when);
}

function clock(date) {
  return date.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
}
