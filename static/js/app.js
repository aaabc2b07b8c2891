// Entry point: frames from the socket go into the Transcript model and the meter; the views render
// from them; user actions come back from the views as bound handlers.

import { api, getToken, pageConfig, setToken, socketUrl, takeTokenFromUrl } from "./api.js";
import { Composer, forgetDrafts } from "./composer.js";
import { ConversationView } from "./conversation.js";
import { copyText, uuid } from "./dom.js";
import { installShortcuts } from "./keys.js";
import { Meter } from "./meter.js";
import { Transcript } from "./model.js";
import { Sessions } from "./sessions.js";
import { Connection } from "./socket.js";
import { Welcome } from "./welcome.js";

const $ = (id) => document.querySelector(`[data-testid="${id}"]`);
const config = pageConfig();
const authRequired = document.body.dataset.authRequired === "true";
const authMode = document.body.dataset.authMode;
const pathMatch = location.pathname.match(/^\/s\/([^/]+)\/?$/);

takeTokenFromUrl();

const transcript = new Transcript();
const view = new ConversationView($("conversation"), $("scroll-bottom"));
const welcome = new Welcome($("welcome"), (text) => composer.render("edit", { text, turnId: null }));
const meter = new Meter($("meter"));
const sessions = new Sessions($("sidebar"), {
  currentId: pathMatch ? decodeURIComponent(pathMatch[1]) : null,
  onError: (message) => showBanner(message),
});
let lastSent = null;
let lastContext = null; // the meter's last reading, shown again when an edit's preview ends

const composer = new Composer($("composer"), { maxImageBytes: config.max_image_bytes });
composer.bind("send", (content, images, replaces) => sendEdit(content, images, replaces));
composer.bind("editEnd", () => lastContext && meter.render("context", lastContext));
composer.bind("stop", () => connection.send({ type: "stop" }));
composer.bind("switch", (route) => connection.send({ type: "switch_model", route }));
composer.bind("editLast", () => editTurn(transcript.lastUser()));

const connection = new Connection({
  url: socketUrl(),
  onFrame: (frame) => handle(frame),
  onStatus: (status) => setStatus(status),
  shouldRetry: (event, greeted) => !tokenRefused(event, greeted),
});
connection.sessionId = sessions.currentId;

transcript.on((change, subject, extra) => {
  view.render(change, subject, extra);
  if (change === "finished") announce(subject);
  if (change === "update" && subject.state === "streaming") return; // nothing below changes per chunk
  view.render("last", { user: transcript.lastUser(), reply: transcript.lastReply() });
  welcome.render(transcript.items.length === 0);
});

view.bind("copy", (entry) => copyText(entry.text));
view.bind("older", () => connection.send({ type: "history_before", before_id: transcript.oldestId() }));
view.bind("edit", (entry) => editTurn(entry));
view.bind("decide", (call, allow) => connection.send({ type: "tool_decision", turn_id: call.turnId, id: call.id, allow }));
view.bind("flip", (entry, step) => transcript.flip(entry.turnId, step));
view.bind("regenerate", (entry) => {
  const user = transcript.userOfTurn(entry.turnId);
  if (user && composer.connected && !transcript.streaming) sendMessage(user.text, [], entry.turnId, "replaced by a regenerated reply");
});

// Edit of any sent message: the last one is replaced (retry_of); an earlier one takes every turn
// after it out of the context too (edit_of). The meter previews the drop until the edit ends.
function editTurn(user) {
  if (!user || !user.turnId || transcript.streaming) return;
  const later = isLastTurn(user.turnId) ? 0 : transcript.turnsAfter(user.turnId);
  composer.render("edit", { text: user.text, turnId: user.turnId, later });
  connection.send({ type: "preview_edit", turn_id: user.turnId });
}

function isLastTurn(turnId) {
  const last = transcript.lastUser();
  return Boolean(last && last.turnId === turnId);
}

function sendEdit(content, images, turnId) {
  if (!turnId || isLastTurn(turnId)) return sendMessage(content, images, turnId, "replaced by an edit");
  return sendMessage(content, images, turnId, "replaced by an edit", "edit_of");
}

// retryOf: the turn this message replaces (a failed turn, an edited message, a regenerated reply);
// field: retry_of replaces that turn alone, edit_of that turn and every later one.
function sendMessage(content, images, retryOf = null, why = "replaced by a retry", field = "retry_of") {
  const id = uuid();
  const frame = { type: "message", id, content };
  if (retryOf) frame[field] = retryOf;
  if (images.length) frame.images = images.map(({ media_type, data }) => ({ media_type, data }));
  if (!connection.send(frame)) return false;
  lastSent = { content, images };
  if (retryOf && field === "edit_of") transcript.replaceFrom(retryOf, id, why);
  else if (retryOf) transcript.replaceTurn(retryOf, id, why);
  // `/model` is a command the server answers with a context or error frame, not a turn.
  if (/^\/model(\s|$)/.test(content)) transcript.addCommand(content);
  else transcript.addPendingUser(id, content, images.map((i) => i.dataUrl));
  syncStreaming();
  return true;
}

// A failed turn's "Try again" after a reload: its message is sent again in its place (retry_of), as
// a regenerate does (attached images are not sent again).
function retryTurn(turnId) {
  return () => {
    const user = transcript.userOfTurn(turnId);
    if (user && composer.connected && !transcript.streaming) sendMessage(user.text, [], turnId);
  };
}

const handlers = {
  session(f) {
    const path = `/s/${encodeURIComponent(f.session_id)}`;
    if (location.pathname !== path) history.replaceState(null, "", path);
    sessions.setCurrent(f.session_id);
    composer.render("draft", f.session_id);
    composer.render("routes", { routes: f.routes, current: f.route });
    welcome.setRoutes(f.routes || []);
    welcome.render(transcript.items.length === 0);
    setTitle(f.title);
    sessions.refresh();
  },
  history(f) {
    transcript.reset(f.messages || [], f.trims || [], f.turn_in_flight || null, f.older || 0, f.notices || [], retryTurn);
    for (const asked of f.approvals || []) transcript.toolApproval(asked);
    view.render("older", transcript.older);
    meter.render("trims", transcript.trims);
  },
  history_page(f) {
    transcript.prepend(f.messages || [], f.older || 0);
    view.render("older", transcript.older);
  },
  accepted: (f) => transcript.accepted(f),
  context(f) {
    // An edit's preview answers this tab's preview_edit: shown while that edit is open.
    if (f.reason === "edit_preview") {
      if (composer.editing) meter.render("context", f);
      return;
    }
    lastContext = f;
    if (!composer.editing) meter.render("context", f);
    if (f.reason === "switch") transcript.switched(f);
    composer.render("trimPreview", f.trim_preview);
    // Hints and fallbacks serve one call; only a switch or the default is the session's choice.
    if (f.route_kind === "switch" || f.route_kind === "default") composer.render("route", f);
    if (f.reason === "switch") sessions.refresh(); // the sidebar lists each session's route
  },
  route: (f) => transcript.route(f),
  chunk: (f) => transcript.chunk(f),
  thinking: (f) => transcript.thinking(f),
  tool_call: (f) => transcript.toolCall(f),
  tool_result: (f) => transcript.toolResult(f),
  tool_approval: (f) => transcript.toolApproval(f),
  tool_decided: (f) => transcript.toolDecided(f),
  history_trimmed(f) {
    transcript.trimmed(f);
    meter.render("trims", transcript.trims);
  },
  done(f) {
    transcript.done(f);
    sessions.refresh();
  },
  aborted: (f) => transcript.aborted(f),
  turns_set_aside: (f) => transcript.turnsSetAside(f),
  budget: (f) => meter.render("budget", f),
  error(f) {
    // A failed turn is retried in its place (retry_of); a refused message is simply sent again.
    const again = lastSent && composer.connected;
    const retry = again ? () => sendMessage(lastSent.content, lastSent.images, f.turn_id || null) : null;
    transcript.error(f, retry);
  },
  notice: (f) => transcript.notice(f),
  title(f) {
    setTitle(f.title);
    sessions.refresh();
  },
};

function handle(frame) {
  const handler = handlers[frame.type];
  if (handler) handler(frame);
  else console.debug("meterchat: no handler for frame", frame.type);
  syncStreaming();
}

function syncStreaming() {
  composer.render("streaming", transcript.streaming);
  view.render("streaming", transcript.streaming);
}

function setTitle(title) {
  $("session-heading").textContent = title || "New chat";
  document.title = title ? `${title} · meterchat` : "meterchat";
}

function setStatus(status) {
  const badge = $("connection-status");
  badge.dataset.status = status;
  badge.textContent = { online: "connected", connecting: "connecting…", offline: "reconnecting…", locked: "access token needed" }[status];
  composer.render("connected", status === "online");
}

function announce(entry) {
  // Polite: a screen reader finishes what it is saying, then reads the reply's opening.
  const text = entry.text.replace(/\s+/g, " ").trim();
  $("announcer").textContent = `Reply finished: ${text.length > 200 ? `${text.slice(0, 200)}…` : text}`;
}

function showBanner(message) {
  const banner = $("banner");
  banner.textContent = message;
  banner.hidden = false;
  clearTimeout(showBanner.timer);
  showBanner.timer = setTimeout(() => (banner.hidden = true), 6000);
}

// ----- the access token -----

// 4401 (or 1008) says the token was refused. A server that refuses the handshake before accepting
// it closes without a code, like a server that is down: on a token page, a socket closed before its
// `session` frame is checked against the REST API, which answers 401 for a wrong token.
function tokenRefused(event, greeted) {
  if (authMode === "accounts" && event.code === 4401) {
    location.assign("/signin"); // signed out here or elsewhere, disabled, or the password changed
    return true;
  }
  if (!authRequired) return false;
  if (event.code === 4401 || event.code === 1008) {
    tokenWrong();
    return true;
  }
  if (greeted) return false;
  api("/api/sessions").then(
    () => connection.reconnectSoon(),
    (error) => (error.status === 401 ? tokenWrong() : connection.reconnectSoon()),
  );
  return true;
}

function tokenWrong() {
  const hadToken = Boolean(getToken());
  setToken("");
  askForToken(hadToken ? "That token was not accepted. Try again." : "");
}

function askForToken(message = "") {
  setStatus("locked");
  const dialog = $("token-form");
  $("token-error").textContent = message;
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

$("sign-out")?.addEventListener("click", () => {
  forgetDrafts(); // what was typed is the signed-in person's: not left for the next one on this browser
  api("/api/auth/signout", { method: "POST", body: {} }).finally(() => location.assign("/signin"));
});

// ----- sidebar and keys -----

$("sidebar-toggle").addEventListener("click", (event) => {
  event.stopPropagation();
  document.body.classList.toggle("sidebar-open");
});
// On a narrow screen the sidebar covers the page; a tap anywhere else puts it away.
document.querySelector("main").addEventListener("click", () => document.body.classList.remove("sidebar-open"));
$("new-chat").addEventListener("click", () => location.assign("/"));

installShortcuts({
  newChat: () => location.assign("/"),
  search: () => {
    document.body.classList.add("sidebar-open");
    sessions.focusSearch();
  },
});

if (authRequired && !getToken()) askForToken();
else connection.connect();
