"""``CallFrames``: the ``route`` and ``context`` (``send``) frames announcing one provider call.

They are emitted once, when the call's request has left (``ProviderRequest.sent``), after the frames
the turn deferred before it (``Session.defer_frames``: its trims and their meter), so building and
sending them overlaps the provider's wait instead of delaying the request; and in any case before the
call's first event or its error: a client sees the same frames in the same order as if they came
before the call.
"""

from __future__ import annotations

from server.protocol import server_frame
from server.routing.meter import Reading
from server.routing.resolver import Route
from server.sessions.session import Session


class CallFrames:
    def __init__(self, session: Session, route: Route, turn_id: str, began: str | None,
                 reading: Reading) -> None:
        self.session: Session | None = session
        self.route = route
        self.turn_id = turn_id
        self.began = began  # the reply's time: when its call began
        self.reading = reading

    def __call__(self) -> None:
        session, self.session = self.session, None
        if session is None:  # emitted already
            return
        session.flush_frames()  # the turn's frames before the call (trims, meter), in order
        session.emit(server_frame("route", turn_id=self.turn_id, created_at=self.began,
                                  **self.route.fields()))
        session.emit_reading("send", self.reading)
