"""One exception tree for everything a user can be told about.

    MeterchatError
    ├── ConfigError                 bad settings file or environment (start-up stops)
    ├── ClientError                 the client sent something we cannot act on
    │   ├── BadFrame                malformed JSON, missing or mistyped field
    │   ├── UnknownFrameType
    │   ├── UnknownRoute            switch_model / hint naming nothing configured
    │   ├── ImageRejected           too large, bad base64, unsupported type
    │   ├── Busy                    a turn is already in flight
    │   ├── UnknownSession          no stored session has that id
    │   ├── SessionExists           creating a session under an id already stored
    │   ├── ImportRejected          an exported session file of the wrong shape
    │   ├── TooLarge                a request body over its limit
    │   ├── UserExists              an account name or email already taken
    │   ├── UnknownUser             no account has that name, email or id
    │   ├── NotFound                no such API token or page for this user (404)
    │   ├── Unauthorized            not signed in, a wrong password, a revoked sign-in (401)
    │   ├── Forbidden               signed in, but not allowed (403)
    │   ├── SigninFlood             too many failed sign-ins from one address for one name (429)
    │   ├── BudgetExhausted         the user's tokens for today are spent ([auth] daily_tokens)
    │   └── FrameFlood              a client sending frames faster than its rate limit
    ├── CapacityExceeded            the prepared request does not fit the known window
    ├── HistoryUnfit                overflow recovery could not drop any turn
    ├── StoreUnavailable            the database cannot be reached (PostgreSQL down or restarting)
    └── ProviderError               translated once, at each provider's boundary
        ├── ContextOverflow         the provider says the prompt is too long
        ├── RateLimited             retry_after seconds when the provider says
        ├── Overloaded
        ├── Unavailable             connection refused, timeout, 5xx
        ├── AuthError               401/403
        ├── ProtocolError           a reply we cannot parse, or a 4xx we do not know
        └── ReplyTooLarge           a streamed reply past [runtime] max_reply_chars (or one tool
                                    call's arguments past max_tool_argument_chars)

``error_frame`` turns any of them (or any other exception) into the body of an ``error`` frame.
"""

from __future__ import annotations

from typing import Any


class MeterchatError(Exception):
    code = "internal_error"
    retryable = False

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ConfigError(MeterchatError):
    code = "config_error"


class ClientError(MeterchatError):
    code = "bad_request"


class BadFrame(ClientError):
    code = "bad_frame"


class UnknownFrameType(ClientError):
    code = "unknown_type"


class UnknownRoute(ClientError):
    code = "unknown_route"


class ImageRejected(ClientError):
    code = "image_rejected"


class Busy(ClientError):
    code = "busy"
    retryable = True


class UnknownSession(ClientError):
    code = "unknown_session"


class SessionExists(ClientError):
    code = "session_exists"


class ImportRejected(ClientError):
    code = "import_rejected"


class UserExists(ClientError):
    code = "user_exists"


class UnknownUser(ClientError):
    code = "unknown_user"


class NotFound(ClientError):
    code = "not_found"


class Unauthorized(ClientError):
    code = "unauthorized"


class Forbidden(ClientError):
    code = "forbidden"


class SigninFlood(ClientError):
    code = "rate_limited"
    retryable = True


class BudgetExhausted(ClientError):
    code = "budget_exhausted"


class TooLarge(ClientError):
    code = "too_large"


class SlowBody(ClientError):
    code = "request_timeout"


class FrameFlood(ClientError):
    """Shares the provider's code: to a client, "slow down" is one answer whoever asks it."""

    code = "rate_limited"
    retryable = True

    def __init__(self, message: str, *, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class CapacityExceeded(MeterchatError):
    code = "capacity_exceeded"

    def __init__(self, message: str, *, estimated: int, window: int) -> None:
        super().__init__(message)
        self.estimated = estimated
        self.window = window


class HistoryUnfit(MeterchatError):
    code = "context_overflow_unrecoverable"


class StoreUnavailable(MeterchatError):
    code = "store_unavailable"
    retryable = True


class ProviderError(MeterchatError):
    code = "provider_error"

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ContextOverflow(ProviderError):
    code = "context_overflow"

    def __init__(
        self, message: str, *, status: int | None = None, requested_tokens: int | None = None,
        limit_tokens: int | None = None,
    ) -> None:
        super().__init__(message, status=status)
        self.requested_tokens = requested_tokens  # prompt tokens the provider counted, when it says
        self.limit_tokens = limit_tokens  # the window it enforced, when it says


class RateLimited(ProviderError):
    code = "rate_limited"
    retryable = True

    def __init__(
        self, message: str, *, status: int | None = None, retry_after: float | None = None
    ) -> None:
        super().__init__(message, status=status)
        self.retry_after = retry_after


class Overloaded(ProviderError):
    code = "overloaded"
    retryable = True


class Unavailable(ProviderError):
    code = "unavailable"
    retryable = True


class AuthError(ProviderError):
    code = "auth_error"


class ProtocolError(ProviderError):
    code = "protocol_error"


class ReplyTooLarge(ProviderError):
    """The provider streamed more than a reply may hold; the turn keeps what came, interrupted."""

    code = "reply_too_large"


def error_frame(exc: BaseException, *, turn_id: str | None = None) -> dict[str, Any]:
    """The one shape every error takes on the wire: ``{type, code, message, retryable, turn_id?}``."""
    if isinstance(exc, MeterchatError):
        body: dict[str, Any] = {"code": exc.code, "message": exc.message, "retryable": exc.retryable}
        if isinstance(exc, RateLimited | FrameFlood) and exc.retry_after is not None:
            body["retry_after"] = exc.retry_after
    else:
        body = {"code": "internal_error", "message": f"internal error: {type(exc).__name__}",
                "retryable": False}
    frame = {"type": "error", **body}
    if turn_id is not None:
        frame["turn_id"] = turn_id
    return frame
