// A `history` frame's stored messages, trims and lines as the transcript's items, drawn as the
// live page drew them: a turn's provider calls join one reply again, tool results land in their
// calls, trim notices go above the turn they happened in, and the other lines (errors, notices, a
// switch, a command) after the message they followed. `t` is the Transcript (its replies, holders,
// trims and retryFor).

import { commandItem, errorItem, footText, item, noticeItem, resultTokens, routeFields, stoppedEarlyItem, switchedItem } from "./lines.js";

// Items for stored messages, each message's holder noted (where a line that followed it goes).
export function storedItems(t, messages, inFlight) {
  const items = [];
  for (const m of messages) {
    const made = stored(t, m, inFlight);
    items.push(...made);
    const holder = made.length ? made[made.length - 1] : t.replies.get(m.turn_id) || items[items.length - 1];
    if (holder) t.holders.set(m.id, holder);
  }
  return items;
}

// Stored lines back where they were drawn; returns those whose message is not loaded yet. A failed
// turn's reply shows its failure as the live page did, not "stopped".
export function placeLines(t, items, lines, complete) {
  const waiting = [];
  for (const n of lines) {
    const reply = n.turn_id ? items.find((i) => i.kind === "assistant" && i.turnId === n.turn_id) : null;
    let index = lineIndex(items, t.holders, n, complete);
    if (index < 0) {
      waiting.push(n);
      continue;
    }
    if (n.type === "route" && reply) Object.assign(reply, routeFields(n)); // the hint it was sent with
    if (n.type === "aborted" && reply && n.route) Object.assign(reply, endedCall(reply, n.route));
    const failed = n.type === "error" ? failedReply(n, reply, items) : null;
    if (failed && failed !== reply) items.splice(index++, 0, failed);
    const entry = storedLine(n, reply, t.retryFor);
    if (!entry) continue;
    if (n.created_at) entry.time = Date.parse(n.created_at);
    items.splice(index, 0, entry);
  }
  return waiting;
}

// What a reply's last call, ended early (stopped or failed), changes in it: the route (such a call
// is not recorded, so a reply that ended in its first call has none yet) and the time, when that
// call began (the live page took it from the call's route frame).
function endedCall(reply, route) {
  const time = route.created_at ? { time: Date.parse(route.created_at) } : {};
  return { ...(reply.route ? {} : routeFields(route)), ...time };
}

// A failed turn's reply as the live page left it: its text so far (none when the call failed
// before its first piece: the live page had opened it on the turn's route frame), marked failed.
function failedReply(n, reply, items) {
  if (reply) return Object.assign(reply, { state: "error", foot: "" }, n.route ? endedCall(reply, n.route) : {});
  if (!n.route) return null;
  const user = items.find((i) => i.kind === "user" && i.turnId === n.turn_id); // its turn's marks
  const marks = { trimmed: Boolean(user && user.trimmed), excluded: (user && user.excluded) || null };
  const when = n.route.created_at || n.created_at;
  const time = when ? Date.parse(when) : null;
  return item("assistant", { role: "assistant", turnId: n.turn_id, state: "error", text: "", thinking: "", tools: [], foot: "", time, ...marks, ...routeFields(n.route) });
}

function stored(t, m, inFlight) {
  const time = m.created_at ? Date.parse(m.created_at) : null;
  const base = { messageId: m.id, turnId: m.turn_id, trimmed: !!m.trimmed, excluded: m.excluded || null, text: m.content || "", time };
  if (m.breadcrumb) return [item("breadcrumb", { ...base, role: m.role })];
  if (m.summary) return [item("summary", { ...base, role: m.role })];
  if (m.role === "system") return [item("system", { ...base, role: "system" })];
  if (m.role === "user") {
    return [item("user", { ...base, role: "user", state: "sent", imageCount: m.images || 0, imageUrls: m.image_urls || null, replaces: m.replaces || null })];
  }
  if (m.role === "tool") return storedResult(t, m, base);
  return storedReply(t, m, base, inFlight);
}

// A tool result lands in its call, inside the reply that asked for it, as the live page showed it.
function storedResult(t, m, base) {
  const reply = t.replies.get(m.turn_id);
  const call = reply && reply.tools.find((c) => c.id === m.tool_call_id);
  if (!call) return [item("tool", { ...base, role: "tool", name: m.name, output: m.content })];
  const error = typeof m.content === "string" && m.content.startsWith("error: ");
  Object.assign(call, { output: m.content, state: error ? "error" : "done", tokens: typeof m.tokens === "number" ? m.tokens : resultTokens(m.content), cut: cutChars(m.content) });
  return [];
}

// The live page grows one reply element per turn (tool calls, then the final text); the history
// has one message per provider call: they join again here.
function storedReply(t, m, base, inFlight) {
  const calls = (m.tool_calls || []).map((c) => ({ id: c.id, name: c.name, args: c.args, server: serverOf(c.name), state: "running", turnId: m.turn_id }));
  // A turn still running shows as streaming (its frames follow), not as "stopped".
  const state = m.streaming || (inFlight && m.turn_id === inFlight) ? "streaming" : m.interrupted ? "stopped" : "done";
  const fields = { state, foot: m.usage ? footText(m.usage) : state === "stopped" ? "stopped" : "" };
  if (m.route) Object.assign(fields, routeFields(m.route));
  const reply = m.turn_id ? t.replies.get(m.turn_id) : null;
  if (reply) {
    // The live reply's text ends as the turn's final text (done's full_response).
    if (m.content) fields.text = m.content;
    Object.assign(reply, fields, { tools: [...reply.tools, ...calls], thinking: reply.thinking + (m.thinking || ""), time: base.time });
    return [];
  }
  const entry = item("assistant", { ...base, role: "assistant", tools: calls, thinking: m.thinking || "", route: "", ...fields });
  if (m.turn_id) t.replies.set(m.turn_id, entry);
  return [entry];
}

// A call with no result ran in a turn that ended (stopped, failed, or a server that went down).
export function settleTools(items, inFlight) {
  for (const entry of items) {
    if (entry.kind !== "assistant" || entry.turnId === inFlight) continue;
    for (const call of entry.tools) if (call.state === "running") call.state = "stopped";
  }
}

// Trim notices where the live page put them: above the turn they happened in, or after the
// message they followed (a trim on restore).
export function placeTrims(t, trims) {
  t.trims = trims.map((f) => ({ ...f, time: f.created_at ? Date.parse(f.created_at) : null }));
  for (const frame of t.trims) {
    const notice = item("trim", { frame, time: frame.time });
    const start = frame.turn_id ? t.items.findIndex((i) => i.turnId === frame.turn_id) : -1;
    const after = frame.after_message_id ? t.items.findIndex((i) => i.messageId === frame.after_message_id) : -1;
    if (start >= 0) t.items.splice(start, 0, notice);
    else if (after >= 0) t.items.splice(after + 1, 0, notice);
    else t.items.push(notice);
  }
}

// A stored notice as the live page drew it, or null when it draws nothing (a stop whose reply is
// there: the reply itself says "stopped"). reply: the turn's reply item, if any; retryFor(turnId):
// the "Try again" of a failed turn.
export function storedLine(n, reply, retryFor) {
  if (n.type === "error") return errorItem(n, retryFor(n.turn_id));
  if (n.type === "notice") return noticeItem(n);
  if (n.type === "context") return switchedItem(n);
  if (n.type === "command") return commandItem(n.content || "");
  if (n.type === "aborted") return reply ? null : stoppedEarlyItem();
  return null;
}

const LINES = new Set(["trim", "notice", "error", "command"]);

// Where a line goes back: after the item that shows the message it followed (`holders`: message
// id -> item, a reply holding all of its turn's messages), past the lines already there that
// happened before it. -1: that message is on an older page not loaded yet. A line from before the
// first message goes first once the first page is loaded (`complete`).
export function lineIndex(items, holders, n, complete) {
  let index;
  if (n.after_message_id) {
    const holder = holders.get(n.after_message_id);
    index = holder ? items.indexOf(holder) + 1 : 0;
    if (index === 0) return -1;
  } else {
    if (!complete) return -1;
    index = 0;
  }
  const time = n.created_at ? Date.parse(n.created_at) : Infinity;
  while (index < items.length && LINES.has(items[index].kind) && !(items[index].time > time)) index++;
  return index;
}

// A reloaded call names its server the way the model saw it (SERVER__TOOL); the demo's lookup has none.
function serverOf(name) {
  const at = typeof name === "string" ? name.indexOf("__") : -1;
  return at > 0 ? name.slice(0, at) : name === "lookup_document" ? "built-in" : null;
}

function cutChars(text) {
  const found = typeof text === "string" ? text.match(/\[\.\.\. (\d+) characters truncated \.\.\.\]/) : null;
  return found ? Number(found[1]) : 0;
}
