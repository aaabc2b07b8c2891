"""Operators' metrics (``[server] metrics``), served at ``/metrics`` in Prometheus text format.

``Metrics`` is what the session core reports to; its own methods do nothing, so a server with
metrics off pays one method call per counted frame and nothing per chunk. ``PrometheusMetrics``
counts into a registry of its own (not the process-wide default: tests build many apps in one
process). What is counted is what this process does: in live mode each instance reports its own
turns, and Prometheus sums the instances.

Frames are counted where ``Session.emit`` already looks at a frame's type (never per chunk):
``done`` (a turn's outcome, tokens in and out per route), ``error`` (by code: provider, store and
Redis errors alike, and a turn's outcome when it names one), ``aborted`` and ``history_trimmed``
(by reason). The turn reports the time to a call's first streamed event and whether a turn runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

COUNTED = frozenset(("done", "error", "aborted", "history_trimmed"))
CONTENT_TYPE = CONTENT_TYPE_LATEST
# Seconds to the first streamed event: a local model answers in milliseconds, a loaded one in tens.
FIRST_TOKEN_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60)


class Metrics:
    """Metrics off: every report is dropped."""

    def frame(self, frame: Mapping[str, Any]) -> None:
        """A frame of a ``COUNTED`` type that this process emitted."""

    def first_event(self, provider: str, model: str, seconds: float) -> None:
        """A provider call's first streamed event arrived ``seconds`` after the call began."""

    def turn_started(self) -> None:
        """A turn began running in this process."""

    def turn_ended(self) -> None:
        """A turn that began here ended, however it ended."""

    def socket_opened(self) -> None:
        """A ``/ws`` connection was accepted."""

    def socket_closed(self) -> None:
        """A ``/ws`` connection ended."""

    def render(self) -> bytes:
        return b""


class PrometheusMetrics(Metrics):
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.sockets = Gauge("meterchat_websockets_open", "Open /ws connections.", registry=r)
        self.running = Gauge("meterchat_turns_running", "Turns running in this process.", registry=r)
        self.turns = Counter("meterchat_turns", "Turns ended, by outcome (done, error, aborted).",
                             ["outcome"], registry=r)
        self.errors = Counter("meterchat_errors", "Error frames sent, by code (provider, store and "
                              "Redis failures included).", ["code"], registry=r)
        self.tokens = Counter("meterchat_tokens", "Tokens the providers counted, by route and direction.",
                              ["provider", "model", "direction"], registry=r)
        self.first = Histogram("meterchat_provider_first_event_seconds", "Time from a provider call to "
                               "its first streamed event.", ["provider", "model"], registry=r,
                               buckets=FIRST_TOKEN_BUCKETS)
        self.trims = Counter("meterchat_trims", "History trims, by reason.", ["reason"], registry=r)

    def frame(self, frame: Mapping[str, Any]) -> None:
        kind = frame["type"]
        if kind == "done":
            self.turns.labels("done").inc()
            provider, model = str(frame.get("provider", "")), str(frame.get("model", ""))
            self.tokens.labels(provider, model, "in").inc(frame.get("input_tokens") or 0)
            self.tokens.labels(provider, model, "out").inc(frame.get("output_tokens") or 0)
        elif kind == "error":
            self.errors.labels(str(frame.get("code", ""))).inc()
            if frame.get("turn_id"):
                self.turns.labels("error").inc()
        elif kind == "aborted":
            self.turns.labels("aborted").inc()
        elif kind == "history_trimmed":
            self.trims.labels(str(frame.get("reason", ""))).inc()

    def first_event(self, provider: str, model: str, seconds: float) -> None:
        self.first.labels(provider, model).observe(seconds)

    def turn_started(self) -> None:
        self.running.inc()

    def turn_ended(self) -> None:
        self.running.dec()

    def socket_opened(self) -> None:
        self.sockets.inc()

    def socket_closed(self) -> None:
        self.sockets.dec()

    def render(self) -> bytes:
        return generate_latest(self.registry)
