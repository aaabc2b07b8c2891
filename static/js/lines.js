// The transcript's items, and its lines that are not messages: a turn's error, a notice, a switch's
// confirmation, a typed command. Live frames and a reload's stored notices (the `history` frame's
// `notices`) build them with the same functions here, so a reload draws what the live page drew.

import { switchedLine } from "./meter.js";

let nextKey = 1;

export function item(kind, fields) {
  return { key: nextKey++, kind, time: Date.now(), ...fields };
}

export function errorItem(f, retry) {
  return item("error", { code: f.code || "", text: f.message || "Something went wrong.", retry: f.retryable ? retry : null });
}

export function noticeItem(f) {
  // Not an error: the turn goes on; the reader should know what the provider did.
  return item("notice", { level: "trim", code: f.code, text: f.message });
}

export const switchedItem = (f) => noticeItem({ code: "switched", message: switchedLine(f) });
export const commandItem = (text) => item("command", { role: "command", text });
export const stoppedEarlyItem = () => item("notice", { level: "info", text: "Stopped before the reply began." });

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
