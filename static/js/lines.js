// The transcript's items, and its lines that are not messages: a turn's error, a notice, a switch's
// confirmation, a typed command. Live frames and a reload's stored notices (the `history` frame's
// `notices`) build them with the same functions here, so a reload draws what the live page drew.

import { fmt } from "./dom.js";
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

// A reply's footer: what its turn's `done` reported (the history's `usage` has the same fields).
export function footText(f) {
  // The input sums the turn's provider calls: a tool loop says how many, so it is not read as one prompt.
  const calls = typeof f.calls === "number" && f.calls > 1 ? ` (${fmt(f.calls)} calls)` : "";
  const parts = [`${fmt(f.input_tokens)} in${calls}`, `${fmt(f.output_tokens)} out`];
  if (typeof f.cost_usd === "number" && f.cost_usd > 0) parts.push(`$${f.cost_usd.toFixed(4)}`);
  return parts.join(" · ");
}

export function routeFields(r) {
  const label = r.model ? `${r.provider}/${r.model}` : r.provider;
  return { route: label, routeTitle: `Served by ${label} (${routeWhy(r)})` };
}

// Why a route served a turn, as its `route` frame said (a stored call or route line says the same).
export function routeWhy(r) {
  return `${r.route_kind}${r.hint ? `, hint "${r.hint}"` : ""}`;
}

// What a tool result adds to the history, as the server estimates it (UTF-8 bytes / 4, plus 4): the
// live frame says it; a reloaded result is measured the same way here.
export function resultTokens(output) {
  const text = typeof output === "string" ? output : JSON.stringify(output ?? "");
  return Math.ceil(new TextEncoder().encode(text).length / 4) + 4;
}
