// Model output -> safe DOM. marked turns markdown into HTML, DOMPurify removes anything that could
// run (script, event handlers, javascript: URLs) before it touches the page. While a reply streams,
// renders are batched to at most one per animation frame: re-parsing the whole text per chunk would
// cost O(n^2) on long replies and repaint far more often than a screen can show.

import { marked } from "../vendor/marked.esm.js";
import DOMPurify from "../vendor/purify.es.mjs";
import { copyText, el } from "./dom.js";
import { highlight, languageOf } from "./highlight.js";

marked.setOptions({ gfm: true, breaks: false, async: false });

DOMPurify.addHook("afterSanitizeAttributes", (node) => {
  // Links from a model open elsewhere and get no handle on this page.
  if (node.tagName === "A" && node.hasAttribute("href")) {
    node.setAttribute("target", "_blank");
    node.setAttribute("rel", "noopener noreferrer nofollow");
  }
});

const PURIFY_CONFIG = { FORBID_TAGS: ["style", "form", "input", "button", "textarea", "select"] };

export function renderMarkdown(target, text) {
  // Built off-page and swapped in whole: one change to the live DOM per render.
  const scratch = document.createElement("template");
  scratch.innerHTML = DOMPurify.sanitize(marked.parse(text ?? ""), PURIFY_CONFIG);
  for (const pre of scratch.content.querySelectorAll("pre")) addCopyButton(pre);
  target.replaceChildren(scratch.content);
  for (const code of target.querySelectorAll(".code-block code")) highlight(code);
}

function addCopyButton(pre) {
  const button = el("button", {
    type: "button",
    class: "copy-code",
    "data-testid": "copy-code",
    "aria-label": "Copy code",
    text: "Copy",
  });
  button.addEventListener("click", async () => {
    const source = pre.querySelector("code")?.textContent ?? pre.textContent;
    const ok = await copyText(source.replace(/\n$/, ""));
    button.textContent = ok ? "Copied" : "Copy failed";
    setTimeout(() => (button.textContent = "Copy"), 1500);
  });
  // marked writes the fence's language as class "language-x"; show it beside the button.
  const code = pre.querySelector("code");
  const lang = code ? languageOf(code) : "";
  const wrapper = el("div", { class: "code-block" });
  pre.replaceWith(wrapper);
  wrapper.append(el("div", { class: "code-head" }, el("span", { class: "code-lang", text: lang }), button), pre);
}

// One pending frame renders every element that changed since the last one.
const dirty = new Map(); // element -> () => text
let frame = 0;

export function scheduleRender(target, getText) {
  dirty.set(target, getText);
  if (!frame) frame = requestAnimationFrame(flushRenders);
}

export function flushRenders() {
  if (frame) cancelAnimationFrame(frame);
  frame = 0;
  const work = [...dirty];
  dirty.clear();
  for (const [target, getText] of work) renderMarkdown(target, getText());
}

export function renderNow(target, text) {
  dirty.delete(target);
  renderMarkdown(target, text);
}
