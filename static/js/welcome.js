// The first minute: an empty chat explains the meter and offers prompts that show it at work.
// On the demo provider a lookup fills the small window until a trim happens, and `/model` to the
// model without a known window shows the meter saying so.

import { el } from "./dom.js";

const GENERAL = [{ text: "hello, who are you?", why: "a first reply, and the meter's count after it" }];
const DEMO = [
  { text: "please look up the paper moon", why: "a tool result fills the context; a few of these and old turns are trimmed" },
  { text: "/model demo/demo-open", why: "switch to a model whose window is unknown: the meter says so" },
  { text: "echo ```python\nprint(\"hello\")\n```", why: "code comes back highlighted, with a copy button" },
];

export class Welcome {
  constructor(root, onPick) {
    this.root = root;
    this.list = root.querySelector('[data-testid="examples"]');
    this.onPick = onPick;
    this.routes = [];
    this.ready = false; // nothing to say before the session frame tells which routes exist
  }

  setRoutes(routes) {
    this.routes = routes;
    this.ready = true;
    const examples = routes.some((r) => r.startsWith("demo/") || r === "demo") ? [...GENERAL, ...DEMO] : GENERAL;
    const usable = examples.filter((e) => !e.text.startsWith("/model ") || routes.includes(e.text.slice(7)));
    this.list.replaceChildren(...usable.map((e) => this.example(e)));
  }

  example({ text, why }) {
    const button = el("button", { type: "button", class: "example", "data-testid": "example", onclick: () => this.onPick(text) });
    button.append(el("code", { text: text.split("\n")[0] + (text.includes("\n") ? " …" : "") }), el("span", { class: "why", text: why }));
    return el("li", {}, button);
  }

  render(empty) {
    this.root.hidden = !(empty && this.ready);
  }
}
