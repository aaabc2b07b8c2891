// The transcript model: every item the conversation shows and its state, in one place.
//
// Frames go in (`apply`), the model updates its items and tells its listeners what changed
// ("reset", "add", "update"). Views render from the items and never read their own DOM back. An item
// is a plain object: {key, kind, role, text, state, turnId, messageId, clientId, time, ...}; `kind`
// is user, assistant, tool, system, breadcrumb, summary, command, notice, trim or error.

import { commandItem, errorItem, footText, item, noticeItem, resultTokens, routeWhy, stoppedEarlyItem, switchedItem } from "./lines.js";
import { placeLines, placeTrims, settleTools, storedItems } from "./restore.js";

export class Transcript {
  constructor() {
    this.items = [];
    this.replies = new Map(); // turn_id -> the reply item that grows next
    this.pendingTurn = null; // the turn a coming `route` frame belongs to
    this.trims = []; // this session's history_trimmed frames, oldest first
    this.replacing = new Map(); // client message id -> the turn it replaces (edit, regenerate)
    this.versions = new Map(); // turn_id -> {turns, shown}: a turn and the turns that replaced it
    this.listeners = [];
    this.older = 0;
    this.holders = new Map(); // message id -> the item that shows it (a reply holds its turn's)
    this.pendingLines = []; // stored lines that follow a message on an older page, not loaded yet
    this.retryFor = () => null;
  }

  on(listener) {
    this.listeners.push(listener);
  }

  emit(change, subject, extra) {
    for (const listener of this.listeners) listener(change, subject, extra);
  }

  add(entry, before = null) {
    const index = before ? this.items.indexOf(before) : -1;
    if (index >= 0) this.items.splice(index, 0, entry);
    else this.items.push(entry);
    this.emit("add", entry, index >= 0 ? before : null);
    return entry;
  }

  update(entry, patch) {
    Object.assign(entry, patch);
    this.emit("update", entry);
    return entry;
  }

  get streaming() {
    return this.pendingTurn !== null || this.items.some((i) => i.state === "streaming");
  }

  // The last user message still sent and its turn: what Up and Edit put back, and what a
  // regenerate sends again.
  lastUser() {
    for (let i = this.items.length - 1; i >= 0; i--) {
      const entry = this.items[i];
      if (entry.kind === "user" && !entry.excluded && entry.state !== "failed") return entry;
    }
    return null;
  }

  lastReply() {
    for (let i = this.items.length - 1; i >= 0; i--) if (this.items[i].kind === "assistant") return this.items[i];
    return null;
  }

  userOfTurn(turnId) {
    return this.items.find((i) => i.kind === "user" && i.turnId === turnId) || null;
  }

  // ----- the transcript from a `history` frame: drawn as the live page drew it -----

  // trims: the session's history_trimmed events; inFlight: the turn still running, if any;
  // older: messages the server holds before the first one here (history paging); lines: the
  // session's stored errors, notices, switches and commands; retryFor(turnId): a failed turn's
  // "Try again".
  reset(messages, trims = [], inFlight = null, older = 0, lines = [], retryFor = () => null) {
    this.older = older;
    this.items = [];
    this.replies.clear();
    this.versions.clear();
    this.holders.clear();
    this.pendingTurn = inFlight;
    this.retryFor = retryFor;
    this.items = storedItems(this, messages, inFlight);
    settleTools(this.items, inFlight);
    placeTrims(this, trims);
    this.pendingLines = placeLines(this, this.items, lines, older === 0);
    for (const entry of this.items) if (entry.replaces) this.linkVersion(entry.replaces, entry.turnId, true);
    for (const [turnId, entry] of this.replies) if (turnId !== inFlight) this.replies.delete(turnId);
    this.emit("reset", this.items);
  }

  // An older page (`history_page`): its messages go before every item shown. Their turns are
  // finished, so none of them is a reply that grows.
  prepend(messages, older) {
    const added = storedItems(this, messages, null);
    for (const entry of added) if (entry.turnId !== this.pendingTurn) this.replies.delete(entry.turnId);
    this.pendingLines = placeLines(this, added, this.pendingLines, older === 0);
    this.items.unshift(...added);
    this.older = older;
    for (const entry of added) if (entry.replaces) this.linkVersion(entry.replaces, entry.turnId, true);
    this.emit("prepend", added);
  }

  oldestId() {
    const first = this.items.find((i) => i.messageId);
    return first ? first.messageId : null;
  }

  // ----- live frames -----

  addPendingUser(id, content, dataUrls) {
    return this.add(item("user", { role: "user", clientId: id, messageId: id, state: "pending", text: content, dataUrls }));
  }

  addCommand(content) {
    return this.add(commandItem(content));
  }

  accepted(f) {
    const found = this.items.find((i) => i.kind === "user" && i.clientId === f.id);
    const time = f.created_at ? Date.parse(f.created_at) : Date.now();
    const entry = found || this.add(item("user", { role: "user", clientId: f.id, messageId: f.id, text: f.content, imageCount: f.images || 0, imageUrls: f.image_urls || null, time }));
    // The text the server kept (a /hint prefix taken off), as a reload shows it.
    this.update(entry, { state: "sent", turnId: f.turn_id, time, text: f.content ?? entry.text });
    this.pendingTurn = f.turn_id;
    // Another tab's edit or regenerate is a version too: the server echoes what it replaced.
    const replaced = this.replacing.get(f.id) || f.retry_of || f.edit_of;
    if (replaced) {
      this.replacing.delete(f.id);
      this.linkVersion(replaced, f.turn_id);
    }
  }

  reply(turnId) {
    let entry = this.replies.get(turnId);
    if (!entry) {
      const version = this.versionLabel(turnId);
      entry = this.add(item("assistant", { role: "assistant", turnId, state: "streaming", text: "", thinking: "", tools: [], foot: "", route: "", version }));
      this.replies.set(turnId, entry);
    }
    return entry;
  }

  route(f) {
    const turnId = f.turn_id || this.pendingTurn;
    if (!turnId) return;
    const label = f.model ? `${f.provider}/${f.model}` : f.provider;
    const entry = this.reply(turnId);
    const time = f.created_at ? Date.parse(f.created_at) : entry.time; // when the call began, by the server's clock
    this.update(entry, { route: label, routeTitle: `Served by ${label} (${routeWhy(f)})`, time });
  }

  chunk(f) {
    const entry = this.reply(f.turn_id);
    this.update(entry, { state: "streaming", text: entry.text + f.content });
  }

  thinking(f) {
    const entry = this.reply(f.turn_id);
    this.update(entry, { thinking: entry.thinking + f.content });
  }

  toolCall(f) {
    const entry = this.reply(f.turn_id);
    const call = { id: f.id, name: f.name, args: f.args, server: f.server || null, state: "running", turnId: f.turn_id };
    this.update(entry, { tools: [...entry.tools, call] });
  }

  // A call waits for the user's answer (live, or again from a reload's history frame).
  toolApproval(f) {
    const entry = this.reply(f.turn_id);
    let call = entry.tools.find((t) => t.id === f.id);
    if (!call) {
      call = { id: f.id, name: f.name, args: f.args, server: f.server, turnId: f.turn_id };
      entry.tools = [...entry.tools, call];
    }
    Object.assign(call, { state: "approval", turnId: f.turn_id });
    this.update(entry, {});
  }

  toolDecided(f) {
    const entry = this.reply(f.turn_id);
    const call = entry.tools.find((t) => t.id === f.id);
    if (!call || call.state !== "approval") return;
    call.state = f.allow ? "running" : "denied";
    this.update(entry, {});
  }

  toolResult(f) {
    const entry = this.reply(f.turn_id);
    const call = entry.tools.find((t) => t.id === f.id);
    if (!call) return this.add(item("tool", { role: "tool", name: f.name, output: f.output, turnId: f.turn_id }));
    const tokens = typeof f.tokens === "number" ? f.tokens : resultTokens(f.output);
    Object.assign(call, { output: f.output, state: f.is_error ? "error" : "done", tokens, cut: f.truncated_chars || 0 });
    this.update(entry, {});
  }

  done(f) {
    const entry = this.reply(f.turn_id);
    const route = f.model ? `${f.provider}/${f.model}` : f.provider;
    const time = f.created_at ? Date.parse(f.created_at) : entry.time; // the server's clock, as a reload shows it
    this.update(entry, { text: f.full_response ?? entry.text, state: "done", route, foot: footText(f), doneAt: Date.now(), time });
    this.finishTurn(f.turn_id);
    this.emit("finished", entry);
  }

  aborted(f) {
    const entry = this.replies.get(f.turn_id);
    if (entry) this.update(entry, { state: "stopped", foot: "stopped", tools: stopped(entry.tools) });
    else this.add(stoppedEarlyItem());
    this.finishTurn(f.turn_id);
  }

  error(f, retry) {
    const entry = f.turn_id ? this.replies.get(f.turn_id) : null;
    if (entry) this.update(entry, { state: "error", tools: stopped(entry.tools) });
    // A message the server refused stays shown, marked; the rest of the page carries on.
    const refused = this.items.filter((i) => i.kind === "user" && (f.message_id ? i.clientId === f.message_id : i.state === "pending"));
    for (const user of refused) this.update(user, { state: "failed" });
    this.add(errorItem(f, retry));
    if (f.turn_id) this.finishTurn(f.turn_id);
  }

  notice(f) {
    this.add(noticeItem(f));
  }

  // A switch took effect: the line with the new route's window and trim preview.
  switched(f) {
    this.add(switchedItem(f));
  }

  finishTurn(turnId) {
    if (this.pendingTurn === turnId) this.pendingTurn = null;
    this.replies.delete(turnId); // the next provider call of a later turn starts a fresh element
  }

  // ----- trims and set-aside turns -----

  trimmed(f) {
    this.trims.push({ ...f, time: Date.now() });
    const turns = new Set(f.turn_ids || []);
    const ids = new Set(f.message_ids || []);
    for (const entry of this.items) if (entry.messageId && ids.has(entry.messageId) && entry.turnId) turns.add(entry.turnId);
    // Replies drawn live carry no server id, but trims drop whole turns: if ids found fewer turns
    // than were dropped, the oldest turns still sent are the ones that went.
    const missing = (f.dropped_turns || 0) - turns.size;
    if (missing > 0) for (const turn of this.oldestSentTurns(missing, turns)) turns.add(turn);
    turns.delete(this.pendingTurn);
    for (const entry of this.items) {
      if ((entry.messageId && ids.has(entry.messageId)) || (entry.turnId && turns.has(entry.turnId))) this.update(entry, { trimmed: true });
    }
    // A trim during a turn sits above the turn it happened in, not below its reply.
    const start = f.turn_id ? this.items.find((i) => i.turnId === f.turn_id) : null;
    this.add(item("trim", { frame: f }), start);
  }

  oldestSentTurns(count, skip) {
    const order = [];
    for (const entry of this.items) {
      const turn = entry.turnId;
      if (turn && !entry.trimmed && !skip.has(turn) && !order.includes(turn)) order.push(turn);
    }
    return order.slice(0, count);
  }

  // ----- versions: a turn replaced by an edit or a regenerate, and the turns that replaced it -----

  replaceTurn(turnId, clientId, why) {
    this.setAside(turnId, why);
    this.replacing.set(clientId, turnId);
  }

  // quiet: while a history frame is read (the items are drawn once, after).
  linkVersion(oldTurn, newTurn, quiet = false) {
    const group = this.versions.get(oldTurn) || { turns: [oldTurn], shown: 0 };
    if (group.turns.includes(newTurn)) return;
    group.turns.push(newTurn);
    group.shown = group.turns.length - 1;
    this.versions.set(oldTurn, group);
    this.versions.set(newTurn, group);
    this.showVersion(group, quiet);
  }

  // Steps the shown version of a turn back (-1) or forward (+1); the others stay in the model, hidden.
  flip(turnId, step) {
    const group = this.versions.get(turnId);
    if (!group) return;
    group.shown = Math.min(group.turns.length - 1, Math.max(0, group.shown + step));
    this.showVersion(group);
  }

  showVersion(group, quiet = false) {
    const shown = group.turns[group.shown];
    for (const entry of this.items) {
      if (!group.turns.includes(entry.turnId)) continue;
      const patch = { versionHidden: entry.turnId !== shown, version: this.versionLabel(entry.turnId) };
      if (quiet) Object.assign(entry, patch);
      else this.update(entry, patch);
    }
  }

  versionLabel(turnId) {
    const group = this.versions.get(turnId);
    return group ? { index: group.turns.indexOf(turnId) + 1, count: group.turns.length } : null;
  }

  // An edit of an earlier message: that turn and every later one leave the context.
  replaceFrom(turnId, clientId, why) {
    for (const turn of this.turnsFrom(turnId)) this.setAside(turn, why);
    this.replacing.set(clientId, turnId);
  }

  turnsFrom(turnId) {
    const order = [...new Set(this.items.filter((i) => i.turnId).map((i) => i.turnId))];
    const start = order.indexOf(turnId);
    return start < 0 ? [] : order.slice(start);
  }

  turnsAfter(turnId) {
    return Math.max(0, this.turnsFrom(turnId).length - 1);
  }

  // A replaced turn stays on the page, greyed: the server no longer sends it to the model. As on
  // the server, what a trim or an earlier set-aside already left out keeps its mark; the server's
  // own word (`turns_set_aside`) replaces this tab's guess.
  setAside(turnId, why, fromServer = false) {
    for (const entry of this.items) {
      if (entry.turnId !== turnId || entry.trimmed || (entry.excluded && !(fromServer && entry.guessed))) continue;
      this.update(entry, { excluded: why, guessed: !fromServer });
    }
  }

  // The server's word on which turns left the context (this tab's edit, or another tab's).
  turnsSetAside(f) {
    for (const turnId of f.turn_ids || []) this.setAside(turnId, f.reason, true);
  }
}

function stopped(tools) {
  return tools.map((t) => (t.state === "running" ? { ...t, state: "stopped" } : t));
}

