"""The user directory: adding, listing, changing and removing accounts over the store.

Rules kept here, whichever door asks (the CLI, header sign-in): names are 1-64 printable characters
without spaces, unique whatever their case; the first account is an admin; when an admin exists,
sessions stored before accounts (ownerless) become the first admin's, so nothing is lost and nothing
is shown to anyone else. Changing a password or disabling a user revokes their sign-ins in the same
write (``server.store.users``).
"""

from __future__ import annotations

import re
import uuid

from server.accounts.passwords import hash_password
from server.errors import ClientError, UnknownUser
from server.store.base import Store
from server.store.users import ROLES, User, utc_now

NAME = re.compile(r"[^\s]{1,64}")
MAX_EMAIL_CHARS = 254


def check_name(name: str) -> str:
    if not NAME.fullmatch(name):
        raise ClientError("name: expected 1 to 64 characters without spaces")
    return name


class Directory:
    def __init__(self, store: Store) -> None:
        self.store = store

    async def add(self, name: str, password: str | None, *, email: str = "", role: str = "",
                  subject: str | None = None) -> User:
        """A new account (``password`` None: one that signs in elsewhere, OIDC or a proxy). With no
        ``role``, the first account is an admin and the others are users."""
        check_name(name)
        if len(email) > MAX_EMAIL_CHARS or (email and "@" not in email):
            raise ClientError("email: expected an address with @")
        existing = await self.store.list_users()
        role = role or ("user" if existing else "admin")
        if role not in ROLES:
            raise ClientError(f"role: expected one of {', '.join(ROLES)}, got {role!r}")
        hashed = await hash_password(password) if password is not None else None
        user = User(uuid.uuid4().hex[:16], name, email, role, hashed, utc_now(), subject=subject)
        await self.store.create_user(user)
        await self.adopt_orphans()
        return user

    async def adopt_orphans(self) -> int:
        """Sessions without an owner go to the first admin (none yet: they wait). How many moved."""
        admin = next((u for u in await self.store.list_users() if u.admin), None)
        return await self.store.claim_orphans(admin.id) if admin is not None else 0

    async def named(self, name: str) -> User:
        user = await self.store.find_user(name)
        if user is None:
            raise UnknownUser(f"no account named {name!r}")
        return user

    async def set_password(self, name: str, password: str) -> User:
        user = await self.named(name)
        await self.store.set_password(user.id, await hash_password(password))
        return user

    async def set_disabled(self, name: str, disabled: bool = True) -> User:
        user = await self.named(name)
        await self.store.set_disabled(user.id, disabled)
        return user

    async def remove(self, name: str, with_sessions: bool) -> int:
        """Delete the account; its sessions go with it, so ``with_sessions`` must say so when it has
        any (``disable`` keeps them). How many sessions were deleted."""
        user = await self.named(name)
        owned = await self.store.count_owned(user.id)
        if owned and not with_sessions:
            raise ClientError(f"{name} owns {owned} session(s): pass --delete-sessions to delete them "
                              "too, or disable the account instead")
        return await self.store.delete_user(user.id)
