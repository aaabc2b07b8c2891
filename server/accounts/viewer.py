"""``Viewer``: who a request or a socket speaks for, and what that lets it see.

In the ``none`` and ``token`` modes nobody signs in: the viewer is ``ANYONE`` and sees every session,
as before accounts. In ``accounts`` and ``header`` modes the viewer is a user, who sees the sessions
they own and nothing else; an admin sees every session's events on ``/events`` but, like anyone,
only their own sessions everywhere else. A session someone may not see is answered exactly as one
that does not exist.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from server.store.users import User


@dataclass(frozen=True)
class Viewer:
    user: User | None
    login: str = ""  # the sign-in's key (hash of the cookie) when it came from one: what revocation names
    token: str = ""  # the API token's hash when it came from one

    @property
    def owner(self) -> str | None:
        """The owner id new sessions get, and the filter on every list; None: no filter."""
        return self.user.id if self.user is not None else None

    def sees(self, owner: str | None) -> bool:
        """Whether a session with ``owner`` (``Store.session_owner``: None for no session, "" for an
        ownerless one) may be shown."""
        return owner is not None and (self.user is None or owner == self.user.id)

    @property
    def sees_all_events(self) -> bool:
        return self.user is None or self.user.admin


ANYONE = Viewer(None)


def viewer_in(scope: Mapping[str, Any]) -> Viewer | None:
    """The viewer ``server.web.auth.Authenticator`` put in a request's scope; None without one."""
    viewer = scope.get("state", {}).get("viewer")
    return viewer if isinstance(viewer, Viewer) else None
