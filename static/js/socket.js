// The WebSocket to /ws (protocol v1): hello first, reconnect with backoff, resume by sequence.
//
// The client keeps the highest `seq` it has applied and drops frames at or below it, so frames the
// server replays after a reconnect are applied once. `session` and `history` frames are exempt: a
// history frame replaces the whole transcript, so it becomes the new baseline even if the server's
// counter restarted lower (a server restart, or a resume it could not replay). `error` frames are
// never dropped, nor is an edit's preview or a `history_page` (answers to this connection; see receive).

import { socketProtocols } from "./api.js";

const BACKOFF_MS = [250, 500, 1000, 2000, 4000, 8000];

export class Connection {
  // shouldRetry(closeEvent, greeted) decides whether a closed socket is tried again; `greeted` says
  // whether that socket got its `session` frame (a refused token never does).
  constructor({ url, onFrame, onStatus, shouldRetry = () => true }) {
    this.url = url;
    this.onFrame = onFrame;
    this.onStatus = onStatus;
    this.shouldRetry = shouldRetry;
    this.greeted = false;
    this.sessionId = null;
    this.lastSeq = 0;
    this.attempt = 0;
    this.ws = null;
    this.timer = 0;
    // Another tab, a dead Wi-Fi or a phone that slept: try again at once when things look up.
    const retryNow = () => this.ws === null && this.reconnectSoon(0);
    window.addEventListener("online", retryNow);
    document.addEventListener("visibilitychange", () => document.visibilityState === "visible" && retryNow());
  }

  get open() {
    return this.ws !== null && this.ws.readyState === WebSocket.OPEN;
  }

  connect() {
    clearTimeout(this.timer);
    this.onStatus("connecting");
    // ?session= lets a proxy keep a session's sockets on one instance (deploy/nginx.conf hashes it).
    const ws = new WebSocket(this.sessionId ? `${this.url}?session=${encodeURIComponent(this.sessionId)}` : this.url, socketProtocols());
    this.ws = ws;
    this.greeted = false;
    ws.addEventListener("open", () => {
      const hello = { type: "hello" };
      if (this.sessionId) hello.session_id = this.sessionId;
      if (this.sessionId && this.lastSeq > 0) hello.last_seq = this.lastSeq;
      ws.send(JSON.stringify(hello));
    });
    ws.addEventListener("message", (event) => this.receive(event.data));
    ws.addEventListener("close", (event) => {
      if (this.ws !== ws) return;
      this.ws = null;
      this.onStatus("offline", event);
      if (this.shouldRetry(event, this.greeted)) this.reconnectSoon();
    });
  }

  reconnectSoon(delay) {
    clearTimeout(this.timer);
    const base = delay ?? BACKOFF_MS[Math.min(this.attempt, BACKOFF_MS.length - 1)];
    this.attempt += 1;
    // Jitter keeps many tabs of a restarted server from knocking in lock-step.
    this.timer = setTimeout(() => this.connect(), base + Math.random() * base * 0.3);
  }

  receive(data) {
    let frame;
    try {
      frame = JSON.parse(data);
    } catch {
      console.warn("meterchat: ignoring a frame that is not JSON", data);
      return;
    }
    const seq = typeof frame.seq === "number" ? frame.seq : null;
    if (frame.type === "session") {
      // Its seq is the baseline: a replay follows it, or a history snapshot with the same seq.
      this.lastSeq = seq ?? 0;
      this.sessionId = frame.session_id;
      this.attempt = 0;
      this.greeted = true;
      this.onStatus("online");
    } else if (frame.type === "history") {
      if (seq !== null) this.lastSeq = seq;
    } else if (frame.type === "history_page") {
      // An older page this connection asked for: it carries the current seq and advances nothing.
    } else if (frame.type === "error" || (frame.type === "context" && frame.reason === "edit_preview")) {
      // Errors and edit previews answering this connection's own request are not in the session's
      // replay log and repeat the current seq; dropping one would hide why a message went nowhere.
      if (seq !== null) this.lastSeq = Math.max(this.lastSeq, seq);
    } else if (seq !== null) {
      if (seq <= this.lastSeq) return;
      this.lastSeq = seq;
    }
    this.onFrame(frame);
  }

  send(frame) {
    if (!this.open) return false;
    this.ws.send(JSON.stringify(frame));
    return true;
  }
}
