// The context meter: how full the prompt of the route that serves the next call is.
//
// Numerator: `estimated_tokens` (labelled estimate or provider count). Denominator: the route's
// `model_context_window` when known; otherwise the trimming budget, and the meter says the window is
// unknown rather than inventing one. A budget below a known window is drawn as a marker on the bar.

import { fmt, routeLabel } from "./dom.js";

const WARN_AT = 0.6;
const DANGER_AT = 0.85;

const REASONS = {
  hello: "session opened",
  switch: "model switched",
  hint: "hint picked a route",
  send: "message about to be sent",
  trim: "history trimmed",
  usage: "provider reported usage",
  done: "reply finished",
  restore: "session restored",
};

export class Meter {
  constructor(root) {
    this.root = root;
    this.q = (id) => root.querySelector(`[data-testid="${id}"]`);
    this.last = null;
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
    this.q("meter-source").textContent = f.tokens_source === "provider" ? "provider count" : "estimate";
    this.q("meter-percent").textContent = ratio === null ? "" : `${Math.round(ratio * 100)}%`;

    const fill = this.q("meter-fill");
    fill.style.width = `${ratio === null ? 0 : Math.min(100, ratio * 100)}%`;
    const marker = this.q("meter-budget-marker");
    const showMarker = windowKnown && budget > 0 && budget < f.model_context_window;
    marker.hidden = !showMarker;
    if (showMarker) marker.style.left = `${(budget / f.model_context_window) * 100}%`;
    const bar = this.q("meter-bar");
    bar.setAttribute("aria-valuenow", String(Math.round((ratio ?? 0) * 100)));

    this.root.title = tooltip(f, windowKnown, budget, ratio);
  }
}

function windowText(windowKnown, f, budget) {
  if (windowKnown) return fmt(f.model_context_window);
  if (budget > 0) return `${fmt(budget)} budget (window unknown)`;
  return "window unknown";
}

function tooltip(f, windowKnown, budget, ratio) {
  const lines = [
    `Route: ${routeLabel(f.provider, f.model)} (${f.route_kind})`,
    `Used: ${fmt(f.estimated_tokens)} tokens (${f.tokens_source === "provider" ? "counted by the provider" : "local estimate"})`,
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
  return source || "unknown source";
}
