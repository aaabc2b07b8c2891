// Entry point: wires the socket's frames to the conversation, meter, composer and sidebar.

import { getToken, setToken, socketUrl, takeTokenFromUrl } from "./api.js";
import { Composer } from "./composer.js";
import { Conversation } from "./conversation.js";
import { uuid } from "./dom.js";
import { renderStats } from "./markdown.js";
import { Meter } from "./meter.js";
import { Sessions } from "./sessions.js";
import { Connection } from "./socket.js";

const $ = (id) => document.querySelector(`[data-testid="${id}"]`);
const authRequired = document.body.dataset.authRequired === "true";
const pathMatch = location.pathname.match(/^\/s\/([^/]+)\/?$/);

takeTokenFromUrl();

const conversation = new Conversation($("conversation"));
const meter = new Meter($("meter"));
const sessions = new Sessions($("sidebar"), {
  currentId: pathMatch ? decodeURIComponent(pathMatch[1]) : null,
  onError: (message) => showBanner(message),
});
let lastSent = null;

const composer = new Composer($("composer"), {
  onSend: (content, images) => sendMessage(content, images),
  onStop: () => connection.send({ type: "stop" }),
  onSwitch: (route) => connection.send({ type: "switch_model", route }),
});

const connection = new Connection({
  url: socketUrl(),
  onFrame: (frame) => {
    handle(frame);
    composer.setStreaming(conversation.streaming);
  },
  onStatus: (status, event) => setStatus(status, event),
});
connection.sessionId = sessions.currentId;

function sendMessage(content, images, retryOf = null) {
  const id = uuid();
  const frame = { type: "message", id, content };
  if (retryOf) frame.retry_of = retryOf;
  if (images.length) frame.images = images.map(({ media_type, data }) => ({ media_type, data }));
  if (!connection.send(frame)) return false;
  lastSent = { content, images };
  if (retryOf) conversation.setAside(retryOf);
  // `/model` is a command the server answers with a context or error frame, not a turn.
  if (/^\/model(\s|$)/.test(content)) conversation.addCommand(content);
  else conversation.addPendingUser(id, content, images.map((i) => i.dataUrl));
  return true;
}

const handlers = {
  session(f) {
    const path = `/s/${encodeURIComponent(f.session_id)}`;
    if (location.pathname !== path) history.replaceState(null, "", path);
    sessions.setCurrent(f.session_id);
    composer.setRoutes(f.routes, f.route);
    setTitle(f.title);
    sessions.refresh();
  },
  history: (f) => conversation.renderHistory(f.messages || []),
  accepted: (f) => conversation.accepted(f),
  context(f) {
    meter.update(f);
    composer.setTrimPreview(f.trim_preview);
    // Hints and fallbacks serve one call; only a switch or the default is the session's choice.
    if (f.route_kind === "switch" || f.route_kind === "default") composer.showRoute(f.provider, f.model);
    if (f.reason === "switch") sessions.refresh(); // the sidebar lists each session's route
  },
  route: (f) => conversation.route(f),
  chunk: (f) => conversation.chunk(f),
  thinking: (f) => conversation.thinking(f),
  tool_call: (f) => conversation.toolCall(f),
  tool_result: (f) => conversation.toolResult(f),
  history_trimmed: (f) => conversation.trimmed(f),
  done(f) {
    conversation.done(f);
    sessions.refresh();
  },
  aborted: (f) => conversation.aborted(f),
  error(f) {
    // A failed turn is retried in its place (retry_of); a refused message is simply sent again.
    const again = lastSent && composer.connected;
    const retry = again ? () => sendMessage(lastSent.content, lastSent.images, f.turn_id || null) : null;
    conversation.error(f, retry);
  },
  notice: (f) => conversation.notice(f),
  title(f) {
    setTitle(f.title);
    sessions.refresh();
  },
};

function handle(frame) {
  const handler = handlers[frame.type];
  if (handler) handler(frame);
  else console.debug("meterchat: no handler for frame", frame.type);
}

function setTitle(title) {
  $("session-heading").textContent = title || "New chat";
  document.title = title ? `${title} · meterchat` : "meterchat";
}

function setStatus(status, event) {
  const badge = $("connection-status");
  badge.dataset.status = status;
  badge.textContent = { online: "connected", connecting: "connecting…", offline: "reconnecting…" }[status];
  composer.setConnected(status === "online");
  // 4401/1008: the server refused the token; ask for another one instead of retrying blindly.
  if (status === "offline" && authRequired && event && (event.code === 4401 || event.code === 1008)) askForToken();
}

function showBanner(message) {
  const banner = $("banner");
  banner.textContent = message;
  banner.hidden = false;
  clearTimeout(showBanner.timer);
  showBanner.timer = setTimeout(() => (banner.hidden = true), 6000);
}

function askForToken() {
  const dialog = $("token-form");
  dialog.hidden = false;
  dialog.querySelector('[data-testid="token-input"]').focus();
}

$("token-form").addEventListener("submit", (event) => {
  event.preventDefault();
  setToken(event.target.querySelector('[data-testid="token-input"]').value.trim());
  event.target.hidden = true;
  connection.url = socketUrl();
  connection.reconnectSoon(0);
  sessions.refresh();
});

$("sidebar-toggle").addEventListener("click", (event) => {
  event.stopPropagation();
  document.body.classList.toggle("sidebar-open");
});
// On a narrow screen the sidebar covers the page; a tap anywhere else puts it away.
document.querySelector("main").addEventListener("click", () => document.body.classList.remove("sidebar-open"));
$("new-chat").addEventListener("click", () => location.assign("/"));

if (authRequired && !getToken()) askForToken();
else connection.connect();

// A handle for the console and for browser tests that feed frames the demo cannot produce on cue.
window.meterchat = {
  connection,
  conversation,
  meter,
  renderStats,
  handle(frame) {
    handle(frame);
    composer.setStreaming(conversation.streaming);
  },
};
