// The context meter: how full the prompt of the route that serves the next call is.
//
// Numerator: `estimated_tokens`, the server's figure for the next request (anchored on a provider count
// or an estimate). Denominator: the route's `model_context_window` when known; otherwise the trimming
// budget, in words ("~3,704 of a 32,000 budget; window not published"), never an invented window. The
// budget is a marker on the bar with a visible label (touch screens show no tooltips).

import { el, fmt, routeLabel } from "./dom.js";

const WARN_AT = 0.6;
const DANGER_AT = 0.85;

const REASONS = {
  hello: "session opened",
  switch: "model switched",
  hint: "hint picked a route",
  send: "message about to be sent",
  trim: "history trimmed",
  usage: "provider reported usage",
  count: "provider counted the next request",
  done: "reply finished",
  restore: "session restored",
};

const TRIM_REASONS = {
  token_budget: "token budget",
  turn_limit: "turn limit",
  overflow_recovery: "provider said the context was full",
  compaction: "compaction",
};

export class Meter {
  constructor(root) {
    this.root = root;
    this.q = (id) => root.querySelector(`[data-testid="${id}"]`);
    this.toggle = this.q("meter-toggle");
    this.panel = this.q("meter-breakdown");
    this.numbers = root.querySelector(".meter-numbers");
    this.panel.tabIndex = 0; // it scrolls on a phone: a keyboard must reach it too
    this.markerLabel = el("span", { class: "meter-budget-label", "data-testid": "meter-budget-label", hidden: true });
    this.q("meter-bar").append(this.markerLabel);
    this.last = null;
    this.trims = [];
    this.toggle.addEventListener("click", () => this.setOpen(this.panel.hidden));
    root.addEventListener("keydown", (event) => {
      if (event.key === "Escape" && !this.panel.hidden) {
        this.setOpen(false);
        this.toggle.focus();
      }
    });
  }

  render(command, value) {
    if (command === "context") this.update(value);
    else if (command === "trims") this.trims = value;
    else if (command === "budget") this.allowance(value);
    if (!this.panel.hidden) this.fillBreakdown();
  }

  setOpen(open) {
    this.panel.hidden = !open;
    this.toggle.setAttribute("aria-expanded", String(open));
    if (open) this.fillBreakdown();
  }

  fillBreakdown() {
    if (!this.last) return;
    const list = el("dl", { class: "breakdown-list" });
    for (const [key, label, value] of breakdownRows(this.last)) {
      list.append(el("dt", { text: label }), el("dd", { "data-testid": `breakdown-${key}`, text: value }));
    }
    const trims = el("div", { class: "breakdown-trims", "data-testid": "breakdown-trims" });
    trims.append(el("h3", { text: this.trims.length ? `Trims this session (${this.trims.length})` : "No trims this session" }));
    if (this.trims.length) trims.append(el("ol", {}, ...this.trims.map((t) => el("li", { "data-testid": "breakdown-trim", text: trimLine(t) }))));
    this.panel.replaceChildren(list, trims);
  }

  // A signed-in user's daily token budget ([auth] daily_tokens): what is left today, beside the window.
  allowance(f) {
    const node = this.q("meter-allowance");
    node.hidden = false;
    node.textContent = `${fmt(f.tokens_left)} of ${fmt(f.daily_tokens)} tokens left today`;
    node.dataset.level = f.tokens_left === 0 ? "danger" : f.tokens_left < f.daily_tokens * 0.1 ? "warn" : "calm";
  }

  update(f) {
    this.last = f;
    const used = f.estimated_tokens;
    const budget = f.context_token_budget > 0 ? f.context_token_budget : 0;
    const windowKnown = typeof f.model_context_window === "number" && f.model_context_window > 0;
    const denominator = windowKnown ? f.model_context_window : budget;
    const ratio = denominator > 0 ? used / denominator : null;

    this.root.hidden = false;
    this.root.dataset.windowKnown = String(windowKnown);
    this.root.dataset.level = ratio === null ? "unknown" : ratio > DANGER_AT ? "danger" : ratio >= WARN_AT ? "warn" : "calm";
    this.root.dataset.routeKind = f.route_kind;

    this.q("meter-route").textContent = routeLabel(f.provider, f.model);
    this.q("meter-route-kind").textContent = f.route_kind === "default" ? "" : f.route_kind;
    this.q("meter-used").textContent = `${f.tokens_source === "estimate" ? "~" : ""}${fmt(used)}`;
    this.q("meter-window").textContent = windowText(windowKnown, f, budget);
    this.numbers.replaceChildren(...numberParts(windowKnown, budget, this.q("meter-used"), this.q("meter-window"), this.q("meter-percent")));
    this.q("meter-source").textContent = f.tokens_source === "estimate" ? "estimate" : "provider count";
    this.q("meter-percent").textContent = ratio === null ? "" : `${Math.round(ratio * 100)}%`;

    const fill = this.q("meter-fill");
    fill.style.width = `${ratio === null ? 0 : Math.min(100, ratio * 100)}%`;
    const marker = this.q("meter-budget-marker");
    // A known window: the budget is marked where it sits below it. Unknown: the budget is the scale's end.
    const showMarker = budget > 0 && (!windowKnown || budget < f.model_context_window);
    const at = windowKnown ? (budget / f.model_context_window) * 100 : 100;
    marker.hidden = !showMarker;
    this.markerLabel.hidden = !showMarker;
    this.root.dataset.marker = String(showMarker);
    if (showMarker) {
      marker.style.left = `${at}%`;
      this.markerLabel.style.left = `${at}%`;
      this.markerLabel.dataset.edge = at > 70 ? "end" : "start";
      this.markerLabel.textContent = `${windowKnown ? "trims at" : "budget"} ${fmt(budget)}`;
    }

    this.root.title = tooltip(f, windowKnown, budget, ratio);
  }
}

function windowText(windowKnown, f, budget) {
  if (windowKnown) return fmt(f.model_context_window);
  if (budget > 0) return `${fmt(budget)} budget; window not published`;
  return "window not published";
}

// "~1,234 / 4,096 tokens 30%", "~1,234 of a 32,000 budget; window not published 4%" or
// "~1,234 tokens; window not published": the words around the numbers change with what is known.
function numberParts(windowKnown, budget, used, window, percent) {
  if (windowKnown) return [used, " / ", window, " tokens ", percent];
  if (budget > 0) return [used, " of a ", window, " ", percent];
  return [used, " tokens; ", window, percent];
}

// The line the conversation shows when a switch took effect: the new route's window and trim preview.
export function switchedLine(f) {
  const route = routeLabel(f.provider, f.model);
  const size = typeof f.model_context_window === "number"
    ? `its window is ${fmt(f.model_context_window)} tokens`
    : `its window is not published; meterchat trims to a ${fmt(f.context_token_budget)}-token budget`;
  let text = `Switched to ${route}: ${size}; the next request is ~${fmt(f.estimated_tokens)} tokens`;
  if (f.trim_preview) {
    const turns = f.trim_preview.turns;
    text += `, so the next send drops the oldest ${fmt(turns)} turn${turns === 1 ? "" : "s"} (~${fmt(f.trim_preview.tokens)} tokens)`;
  }
  return `${text}.`;
}

function tooltip(f, windowKnown, budget, ratio) {
  const lines = [
    `Route: ${routeLabel(f.provider, f.model)} (${f.route_kind})`,
    `Used: ${fmt(f.estimated_tokens)} tokens (${f.tokens_source === "estimate" ? "local estimate" : "counted by the provider"})`,
    windowKnown
      ? `Context window: ${fmt(f.model_context_window)} tokens (from ${windowSource(f.window_source)})`
      : "Context window: unknown for this route",
    budget > 0 ? `Trimming budget: ${fmt(budget)} tokens` : "Trimming budget: none (proactive trimming off)",
  ];
  if (ratio !== null) lines.push(`Fill: ${(ratio * 100).toFixed(1)}% of the ${windowKnown ? "window" : "budget"}`);
  if (f.trim_preview) lines.push(`Next send trims ${fmt(f.trim_preview.turns)} turns, ~${fmt(f.trim_preview.tokens)} tokens`);
  lines.push(`Updated: ${REASONS[f.reason] || f.reason}`);
  return lines.join("\n");
}

function windowSource(source) {
  if (source === "config") return "configuration";
  if (source === "provider") return "provider metadata";
  if (source === "provider_error") return "a provider error";
  if (source === "fallback") return "a fallback";
  return source || "unknown source";
}

// [key, label, text] for each field the frame has; an absent field gets no row.
function breakdownRows(f) {
  const rows = [["route", "Route", `${routeLabel(f.provider, f.model)} (${f.route_kind})`]];
  if (typeof f.estimated_tokens === "number") {
    const source = f.tokens_source === "estimate" ? "local estimate" : "counted by the provider";
    rows.push(["tokens", "Context now", `${fmt(f.estimated_tokens)} tokens (${source})`]);
  }
  if (typeof f.context_token_budget === "number") {
    rows.push(["budget", "Trimming budget", f.context_token_budget > 0 ? `${fmt(f.context_token_budget)} tokens` : "none (trimming off)"]);
  }
  if (typeof f.model_context_window === "number") rows.push(["window", "Context window", `${fmt(f.model_context_window)} tokens`]);
  else rows.push(["window", "Context window", "not published for this route; the bar's scale is the trimming budget"]);
  if (f.context_token_budget > 0) rows.push(["marker", "Budget marker", "where meterchat starts dropping the oldest turns"]);
  if (f.window_source) rows.push(["window-source", "Window from", windowSource(f.window_source)]);
  // Fields a later server may send: shown when present, never guessed.
  for (const [key, label] of OPTIONAL_PARTS) if (typeof f[key] === "number") rows.push([key.replace(/_/g, "-"), label, `${fmt(f[key])} tokens${key === "tool_schema_tokens" ? byServer(f.tool_servers) : ""}`]);
  if (typeof f.calibration_ratio === "number") rows.push(["calibration", "Calibration", `× ${f.calibration_ratio.toFixed(2)} of the estimate`]);
  if (f.trim_preview) rows.push(["trim-preview", "Next send trims", `${fmt(f.trim_preview.turns)} turns, ~${fmt(f.trim_preview.tokens)} tokens`]);
  rows.push(["reason", "Updated", REASONS[f.reason] || f.reason]);
  return rows;
}

// Which servers the tool schemas come from: "(time 180, built-in 95)".
function byServer(servers) {
  const parts = Object.entries(servers || {}).map(([name, tokens]) => `${name} ${fmt(tokens)}`);
  return parts.length ? ` (${parts.join(", ")})` : "";
}

const OPTIONAL_PARTS = [
  ["system_tokens", "System prompt"],
  ["tool_schema_tokens", "Tool schemas"],
  ["history_tokens", "History sent"],
  ["trimmed_tokens", "History trimmed"],
  ["image_tokens", "Images"],
  ["reply_reserve", "Reply reserve"],
];

function trimLine(t) {
  const turns = `${fmt(t.dropped_turns)} turn${t.dropped_turns === 1 ? "" : "s"}`;
  let text = `${turns} dropped (${TRIM_REASONS[t.reason] || t.reason})`;
  if (typeof t.tokens_before === "number" && typeof t.tokens_after === "number") text += `: ${fmt(t.tokens_before)} → ${fmt(t.tokens_after)} tokens`;
  return text;
}
