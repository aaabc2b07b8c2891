"""``meterchat users ...``: accounts on the command line, against the store the settings name.

    meterchat users add NAME [--email E] [--role admin|user]   the first account is an admin
    meterchat users list
    meterchat users passwd NAME          revokes the user's sign-ins on every instance
    meterchat users disable NAME         likewise; ``enable`` undoes it
    meterchat users remove NAME [--delete-sessions]
    meterchat users usage                sessions, tokens and cost this month, per user

A password is read from a prompt (twice) on a terminal, else from the first line of stdin; never
from the command line, where ``ps`` and shell history would keep it.
"""

from __future__ import annotations

import argparse
import getpass
import sys
from collections.abc import Awaitable, Callable
from typing import TextIO

import anyio

from server.accounts.directory import Directory
from server.accounts.usage import month_start, usage_table
from server.config.load import load_settings
from server.errors import MeterchatError
from server.store.backends import open_store


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="meterchat users", description="Manage meterchat accounts.")
    parser.add_argument("--config", help="TOML settings file naming the store (default: the embedded one)")
    commands = parser.add_subparsers(dest="command", required=True)
    add = commands.add_parser("add", help="add an account (the first one is an admin)")
    add.add_argument("name")
    add.add_argument("--email", default="")
    add.add_argument("--role", choices=["admin", "user"], default="")
    commands.add_parser("list", help="list the accounts")
    for name, text in (("passwd", "set a new password (signs the user out everywhere)"),
                       ("disable", "refuse the user's sign-ins (signs them out everywhere)"),
                       ("enable", "allow a disabled user again")):
        commands.add_parser(name, help=text).add_argument("name")
    remove = commands.add_parser("remove", help="delete an account")
    remove.add_argument("name")
    remove.add_argument("--delete-sessions", action="store_true", help="also delete the sessions it owns")
    commands.add_parser("usage", help="sessions, tokens and cost this month, per user")
    return parser.parse_args(argv)


def read_password(stdin: TextIO, prompt: Callable[[str], str] = getpass.getpass) -> str:
    if not stdin.isatty():
        return stdin.readline().rstrip("\r\n")
    first = prompt("Password: ")
    if prompt("Password again: ") != first:
        raise MeterchatError("the two passwords differ")
    return first


async def run(args: argparse.Namespace, directory: Directory, out: TextIO) -> None:
    name = getattr(args, "name", "")
    if args.command == "add":
        user = await directory.add(name, read_password(sys.stdin), email=args.email, role=args.role)
        print(f"added {user.name} ({user.role})", file=out)
    elif args.command == "list":
        for user in await directory.store.list_users():
            state = " disabled" if user.disabled else ""
            print(f"{user.name}\t{user.role}{state}\t{user.email or '-'}\t{user.created_at}", file=out)
    elif args.command == "passwd":
        await directory.set_password(name, read_password(sys.stdin))
        print(f"password of {name} changed; its sign-ins are revoked", file=out)
    elif args.command in ("disable", "enable"):
        await directory.set_disabled(name, args.command == "disable")
        print(f"{name} {args.command}d", file=out)
    elif args.command == "remove":
        deleted = await directory.remove(name, args.delete_sessions)
        print(f"removed {name} and {deleted} session(s)", file=out)
    elif args.command == "usage":
        print(usage_table(await directory.store.usage_since(month_start())), file=out)


def main(argv: list[str]) -> int:
    args = parse(argv)
    try:
        settings = load_settings(args.config)
        store = open_store(settings.server.data_dir, settings.store.url, settings.store.pool_size,
                           settings.store.timeout_seconds)
    except MeterchatError as exc:
        print(f"meterchat users: {exc}", file=sys.stderr)
        return 2
    return anyio.run(_session, args, store.close, Directory(store))


async def _session(args: argparse.Namespace, close: Callable[[], Awaitable[None]],
                   directory: Directory) -> int:
    try:
        await run(args, directory, sys.stdout)
    except MeterchatError as exc:
        print(f"meterchat users: {exc}", file=sys.stderr)
        return 1
    finally:
        await close()
    return 0
