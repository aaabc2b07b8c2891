// Syntax highlighting for fenced code blocks, loaded on first use: the page pays for highlight.js
// (vendored core and a handful of languages) only once a reply contains code.

const LANGUAGES = {
  python: ["python", "py"],
  javascript: ["javascript", "js", "jsx", "mjs"],
  typescript: ["typescript", "ts", "tsx"],
  bash: ["bash", "sh", "zsh"],
  shell: ["shell", "console"],
  json: ["json"],
  xml: ["xml", "html", "svg"],
  css: ["css"],
  sql: ["sql"],
  rust: ["rust", "rs"],
  go: ["go", "golang"],
  yaml: ["yaml", "yml", "toml"],
  diff: ["diff", "patch"],
};
const MODULE_OF = new Map(Object.entries(LANGUAGES).flatMap(([module, names]) => names.map((n) => [n, module])));

let core = null; // Promise of the highlight.js instance
const loaded = new Map(); // module name -> Promise that resolves once registered

function loadCore() {
  core ??= import("../vendor/highlight/core.js").then((m) => m.default);
  return core;
}

function loadLanguage(module) {
  if (!loaded.has(module)) {
    loaded.set(module, Promise.all([loadCore(), import(`../vendor/highlight/languages/${module}.js`)]).then(([hljs, lang]) => {
      hljs.registerLanguage(module, lang.default);
      return hljs;
    }));
  }
  return loaded.get(module);
}

export function languageOf(code) {
  return (code.className.match(/language-([\w+#.-]+)/) || [])[1]?.toLowerCase() || "";
}

// Highlights one <code> element in place if its fence names a language we ship; others stay plain.
export async function highlight(code) {
  const module = MODULE_OF.get(languageOf(code));
  if (!module) return false;
  const hljs = await loadLanguage(module);
  if (!code.isConnected || code.dataset.highlighted) return false; // re-rendered meanwhile
  const source = code.textContent;
  code.innerHTML = hljs.highlight(source, { language: module, ignoreIllegals: true }).value;
  code.classList.add("hljs");
  code.dataset.highlighted = "yes";
  return true;
}
