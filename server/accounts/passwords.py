"""Password hashes: argon2id (``argon2-cffi``'s defaults, its recommended profile).

A hash costs about 64 MiB and tens of milliseconds of CPU, so ``hash_password`` and ``verify`` run in
a worker thread (the event loop never waits on one) and at most ``MAX_HASHING`` at once (a flood of
sign-in attempts cannot take the process's memory).
"""

from __future__ import annotations

import anyio
import anyio.to_thread
from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError

from server.errors import ClientError

MIN_PASSWORD_CHARS = 8
MAX_PASSWORD_CHARS = 1024  # argon2 takes any length; a megabyte "password" would only cost us time
MAX_HASHING = 4
_hasher = PasswordHasher()
_limiter: anyio.CapacityLimiter | None = None


def check_password(password: str) -> str:
    if not MIN_PASSWORD_CHARS <= len(password) <= MAX_PASSWORD_CHARS:
        raise ClientError(f"password: expected {MIN_PASSWORD_CHARS} to {MAX_PASSWORD_CHARS} characters, "
                          f"got {len(password)}")
    return password


def _hashing() -> anyio.CapacityLimiter:
    global _limiter  # one per process, made inside the event loop that first hashes
    if _limiter is None:
        _limiter = anyio.CapacityLimiter(MAX_HASHING)
    return _limiter


async def hash_password(password: str) -> str:
    check_password(password)
    return await anyio.to_thread.run_sync(_hasher.hash, password, limiter=_hashing())


def _matches(password_hash: str, password: str) -> bool:
    try:
        return _hasher.verify(password_hash, password)
    except (VerifyMismatchError, VerificationError, InvalidHashError):
        return False


async def verify(password_hash: str | None, password: str) -> bool:
    """Whether ``password`` matches; a user without a password (OIDC, header) never matches. A hash
    is computed even then, so the answer takes as long for an unknown name as for a wrong password."""
    if len(password) > MAX_PASSWORD_CHARS:
        return False
    if password_hash is None:
        await anyio.to_thread.run_sync(_matches, _DUMMY, password, limiter=_hashing())
        return False
    return await anyio.to_thread.run_sync(_matches, password_hash, password, limiter=_hashing())


_DUMMY = _hasher.hash("not a password of anyone")
