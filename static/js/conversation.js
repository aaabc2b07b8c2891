// The conversation column: user messages, replies (one element per turn while it streams), tool
// items, thinking, trim notices and inline errors. Elements carry data-* attributes that say what
// they are (role, turn, server message id, state), which both the CSS and the browser tests read.

import { el, fmt, routeLabel } from "./dom.js";
import { flushRenders, renderNow, scheduleRender } from "./markdown.js";

const TRIM_REASONS = {
  token_budget: "to fit the context window",
  turn_limit: "to stay within the turn limit",
  overflow_recovery: "after the provider said the context was full",
  compaction: "by compaction",
};

export class Conversation {
  constructor(root) {
    this.root = root;
    this.replies = new Map(); // turn_id -> {node, text, thinking} of the reply that grows next
    this.pendingTurn = null; // the turn a coming `route` frame belongs to
    this.pinPending = false;
  }

  clear() {
    this.root.replaceChildren();
    this.replies.clear();
    this.pendingTurn = null;
  }

  append(node) {
    // Stay pinned to the bottom only if the reader already was; never yank them away from old text.
    const nearBottom = this.root.scrollHeight - this.root.scrollTop - this.root.clientHeight < 80;
    this.root.append(node);
    if (nearBottom) this.root.scrollTop = this.root.scrollHeight;
    return node;
  }

  keepPinned() {
    const gap = this.root.scrollHeight - this.root.scrollTop - this.root.clientHeight;
    if (gap < 240) this.root.scrollTop = this.root.scrollHeight;
  }

  // ----- transcript from a `history` frame -----

  renderHistory(messages) {
    this.clear();
    for (const message of messages) this.renderStored(message);
    flushRenders();
    this.root.scrollTop = this.root.scrollHeight;
  }

  renderStored(m) {
    const data = { role: m.role, messageId: m.id, turnId: m.turn_id };
    if (m.trimmed) data.trimmed = "true";
    if (m.excluded) data.excluded = m.excluded;
    if (m.breadcrumb || m.summary) {
      const kind = m.breadcrumb ? "breadcrumb" : "summary";
      const node = el("div", { class: `msg ${kind}`, dataset: { ...data, kind } });
      if (m.summary) node.append(el("div", { class: "msg-meta", text: "Summary of earlier turns" }));
      node.append(el("div", { class: "msg-body", text: m.content }));
      return this.append(node);
    }
    if (m.role === "system") {
      const details = el("details", { class: "msg system", dataset: data }, el("summary", { text: "System prompt" }));
      details.append(el("div", { class: "msg-body", text: m.content }));
      return this.append(details);
    }
    if (m.role === "user") return this.append(userNode(m.content, [], m.images, { ...data, state: "sent" }));
    if (m.role === "tool") {
      this.replies.delete(m.turn_id); // a reply after a tool result is a new element
      return this.append(toolResultNode(m.name, m.content, data));
    }
    const reply = replyNode({ ...data, state: m.interrupted ? "stopped" : "done" });
    for (const call of m.tool_calls || []) reply.querySelector(".tools").append(toolCallNode(call));
    const body = reply.querySelector(".msg-body");
    if (m.content) renderNow(body, m.content);
    if (m.interrupted) setStatus(reply, "stopped");
    this.append(reply);
    if (m.turn_id) this.replies.set(m.turn_id, { node: reply, text: m.content || "", thinking: "" });
  }

  // ----- live frames -----

  addPendingUser(id, content, images) {
    const dataset = { role: "user", clientId: id, messageId: id, state: "pending" };
    const node = this.append(userNode(content, images, 0, dataset));
    this.root.scrollTop = this.root.scrollHeight; // the reader just sent it: follow the new turn
    return node;
  }

  addCommand(content) {
    return this.append(el("div", { class: "msg command", dataset: { role: "command" }, text: content }));
  }

  accepted(frame) {
    let node = this.root.querySelector(`[data-client-id="${CSS.escape(frame.id)}"]`);
    if (!node) {
      const dataset = { role: "user", clientId: frame.id, messageId: frame.id };
      node = this.append(userNode(frame.content, [], frame.images, dataset));
    }
    node.dataset.state = "sent";
    node.dataset.turnId = frame.turn_id;
    this.pendingTurn = frame.turn_id;
  }

  reply(turnId) {
    let entry = this.replies.get(turnId);
    if (!entry) {
      const node = this.append(replyNode({ role: "assistant", turnId, state: "streaming" }));
      entry = { node, text: "", thinking: "" };
      this.replies.set(turnId, entry);
    }
    return entry;
  }

  route(frame) {
    const turnId = frame.turn_id || this.pendingTurn;
    if (!turnId) return;
    const { node } = this.reply(turnId);
    const label = node.querySelector(".route");
    label.textContent = routeLabel(frame.provider, frame.model);
    label.title = `Served by ${routeLabel(frame.provider, frame.model)} (${frame.route_kind}${frame.hint ? `, hint "${frame.hint}"` : ""})`;
  }

  chunk(frame) {
    const entry = this.reply(frame.turn_id);
    entry.node.dataset.state = "streaming";
    entry.text += frame.content;
    const body = entry.node.querySelector(".msg-body");
    scheduleRender(body, () => entry.text);
    if (!this.pinPending) {
      this.pinPending = true;
      requestAnimationFrame(() => {
        this.pinPending = false;
        this.keepPinned();
      });
    }
  }

  thinking(frame) {
    const entry = this.reply(frame.turn_id);
    entry.thinking += frame.content;
    const details = entry.node.querySelector(".thinking");
    details.hidden = false;
    details.querySelector(".thinking-text").textContent = entry.thinking;
  }

  toolCall(frame) {
    const { node } = this.reply(frame.turn_id);
    node.querySelector(".tools").append(toolCallNode(frame));
  }

  toolResult(frame) {
    const { node } = this.reply(frame.turn_id);
    const item = node.querySelector(`[data-tool-call-id="${CSS.escape(frame.id)}"]`);
    const output = toolOutput(frame.output);
    if (item) {
      item.append(output);
      item.dataset.state = "done";
    } else node.querySelector(".tools").append(toolResultNode(frame.name, frame.output, { role: "tool" }));
  }

  done(frame) {
    const entry = this.reply(frame.turn_id);
    entry.text = frame.full_response ?? entry.text;
    renderNow(entry.node.querySelector(".msg-body"), entry.text);
    entry.node.dataset.state = "done";
    const route = routeLabel(frame.provider, frame.model);
    entry.node.querySelector(".route").textContent = route;
    const parts = [`${fmt(frame.input_tokens)} in`, `${fmt(frame.output_tokens)} out`];
    if (typeof frame.cost_usd === "number" && frame.cost_usd > 0) parts.push(`$${frame.cost_usd.toFixed(4)}`);
    setStatus(entry.node, parts.join(" · "));
    this.finishTurn(frame.turn_id);
    this.keepPinned();
  }

  aborted(frame) {
    const entry = this.replies.get(frame.turn_id);
    if (entry) {
      flushRenders();
      entry.node.dataset.state = "stopped";
      setStatus(entry.node, "stopped");
    } else this.append(notice("info", "Stopped before the reply began."));
    this.finishTurn(frame.turn_id);
  }

  error(frame, onRetry) {
    const entry = frame.turn_id ? this.replies.get(frame.turn_id) : null;
    if (entry) {
      flushRenders();
      entry.node.dataset.state = "error";
    }
    // A message the server refused stays shown, marked; the rest of the page carries on.
    const refused = frame.message_id
      ? this.root.querySelectorAll(`[data-client-id="${CSS.escape(frame.message_id)}"]`)
      : this.root.querySelectorAll('[data-role="user"][data-state="pending"]');
    for (const node of refused) node.dataset.state = "failed";
    const box = notice("error", frame.message || "Something went wrong.");
    box.dataset.testid = "error";
    box.dataset.code = frame.code || "";
    box.setAttribute("role", "alert");
    if (frame.code) box.prepend(el("span", { class: "code", text: frame.code }), " ");
    if (frame.retryable && onRetry) {
      box.append(" ", el("button", { type: "button", class: "link", text: "Try again", onclick: onRetry }));
    }
    this.append(box);
    if (frame.turn_id) this.finishTurn(frame.turn_id);
  }

  notice(frame) {
    // Not an error: the turn goes on; the reader should know what the provider did.
    const box = notice("trim", frame.message);
    box.dataset.testid = "notice";
    box.dataset.code = frame.code;
    this.append(box);
  }

  finishTurn(turnId) {
    if (this.pendingTurn === turnId) this.pendingTurn = null;
    // The next provider call of a later turn starts a fresh element.
    this.replies.delete(turnId);
  }

  get streaming() {
    return this.pendingTurn !== null || this.root.querySelector('[data-state="streaming"]') !== null;
  }

  // ----- trims -----

  trimmed(frame) {
    const turns = new Set(frame.turn_ids || []);
    for (const id of frame.message_ids || []) {
      const node = this.root.querySelector(`[data-message-id="${CSS.escape(id)}"]`);
      if (!node) continue;
      greyOut(node);
      if (node.dataset.turnId) turns.add(node.dataset.turnId);
    }
    // Replies drawn live carry no server id, but trims drop whole turns: grey the rest of each turn
    // found, and if ids found fewer turns than were dropped, the oldest turns still sent.
    const missing = (frame.dropped_turns || 0) - turns.size;
    if (missing > 0) for (const turn of this.oldestSentTurns(missing, turns)) turns.add(turn);
    turns.delete(this.pendingTurn);
    for (const node of this.root.querySelectorAll("[data-turn-id]")) {
      if (turns.has(node.dataset.turnId)) greyOut(node);
    }
    // Mid-turn trims (after a tool result) sit above the turn they happened in, not below its reply.
    const notice = trimNotice(frame);
    const turnStart = frame.turn_id && this.root.querySelector(`[data-turn-id="${CSS.escape(frame.turn_id)}"]`);
    if (turnStart) {
      // Inserted above the turn being written: a reader following the stream stays with it.
      const gap = this.root.scrollHeight - this.root.scrollTop - this.root.clientHeight;
      turnStart.before(notice);
      if (gap < 240) this.root.scrollTop = this.root.scrollHeight;
    } else this.append(notice);
  }

  setAside(turnId) {
    // A retried turn stays on the page, greyed: the server no longer sends it to the model.
    for (const node of this.root.querySelectorAll(`[data-turn-id="${CSS.escape(turnId)}"]`)) {
      node.dataset.excluded = "replaced by a retry";
      node.title = "Replaced by a retry: no longer sent to the model";
    }
  }

  oldestSentTurns(count, skip) {
    const order = [];
    for (const node of this.root.querySelectorAll("[data-turn-id]")) {
      const turn = node.dataset.turnId;
      if (node.dataset.trimmed !== "true" && !skip.has(turn) && !order.includes(turn)) order.push(turn);
    }
    return order.slice(0, count);
  }
}

function greyOut(node) {
  node.dataset.trimmed = "true";
  node.title = "Trimmed: no longer sent to the model";
}

function trimNotice(f) {
  const turns = `${fmt(f.dropped_turns)} turn${f.dropped_turns === 1 ? "" : "s"}`;
  const msgs = `${fmt(f.dropped_messages)} message${f.dropped_messages === 1 ? "" : "s"}`;
  let text = `Earlier turns were trimmed ${TRIM_REASONS[f.reason] || `(${f.reason})`}: `;
  text += `${turns} (${msgs}) dropped, ${fmt(f.kept_turns)} kept`;
  if (typeof f.tokens_before === "number" && typeof f.tokens_after === "number") {
    text += `; ${fmt(f.tokens_before)} → ${fmt(f.tokens_after)} tokens`;
    if (typeof f.token_budget === "number" && f.token_budget > 0) text += ` of a ${fmt(f.token_budget)} budget`;
  }
  const node = notice("trim", `${text}.`);
  node.dataset.testid = "trim-notice";
  node.dataset.reason = f.reason;
  return node;
}

function notice(kind, text) {
  return el("div", { class: `notice ${kind}` }, text);
}

function userNode(content, dataUrls, imageCount, dataset) {
  const node = el("article", { class: "msg user", dataset });
  node.append(el("div", { class: "msg-body plain", text: content }));
  if (dataUrls && dataUrls.length) {
    const strip = el("div", { class: "thumbs" });
    for (const url of dataUrls) strip.append(el("img", { src: url, alt: "attached image" }));
    node.append(strip);
  } else if (imageCount) {
    node.append(el("div", { class: "msg-meta", text: `${imageCount} image${imageCount === 1 ? "" : "s"} attached` }));
  }
  return node;
}

function replyNode(dataset) {
  return el(
    "article",
    { class: "msg assistant", dataset },
    el("div", { class: "msg-meta" }, el("span", { class: "route", "data-testid": "reply-route" })),
    el("details", { class: "thinking", hidden: true }, el("summary", { text: "Thinking" }), el("div", { class: "thinking-text" })),
    el("div", { class: "tools" }),
    el("div", { class: "msg-body markdown" }),
    el("div", { class: "msg-foot" }),
  );
}

function setStatus(node, text) {
  node.querySelector(".msg-foot").textContent = text;
}

function toolCallNode(call) {
  const args = typeof call.args === "string" ? call.args : JSON.stringify(call.args ?? {}, null, 2);
  return el(
    "details",
    { class: "tool", dataset: { toolCallId: call.id, state: "running" } },
    el("summary", {}, "Tool ", el("code", { text: call.name })),
    el("pre", { class: "tool-args", text: args }),
  );
}

function toolOutput(output) {
  const text = typeof output === "string" ? output : JSON.stringify(output, null, 2);
  return el("pre", { class: "tool-output", text });
}

function toolResultNode(name, output, dataset) {
  return el(
    "details",
    { class: "msg tool", dataset },
    el("summary", {}, "Tool result ", el("code", { text: name || "" })),
    toolOutput(output),
  );
}
