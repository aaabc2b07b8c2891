"""Which store a server uses: ``open_store`` picks the backend ``[store] url`` names.

Kept apart from ``server.store.base`` (the interface and the codec every backend imports) so that no
backend module and the interface import each other.
"""

from __future__ import annotations

from pathlib import Path

from server.errors import ConfigError
from server.store.base import Store
from server.store.postgres import PostgresStore
from server.store.sqlite import SqliteStore


def open_store(data_dir: str | Path, url: str = "", pool_size: int = 10, timeout: float = 10.0) -> Store:
    """The store ``[store] url`` names (PostgreSQL), else the embedded one: ``meterchat.sqlite3``
    under ``data_dir`` (both created if missing). Either is migrated to the current schema."""
    if not url:
        return SqliteStore.open(data_dir, timeout)
    if url.split("://", 1)[0] not in ("postgresql", "postgres"):
        raise ConfigError("store.url: expected postgresql://USER@HOST:PORT/DATABASE")
    if pool_size < 1:
        raise ConfigError(f"store.pool_size: expected at least 1, got {pool_size}")
    if timeout <= 0:
        raise ConfigError(f"store.timeout_seconds: expected more than 0, got {timeout}")
    return PostgresStore.open(url, pool_size, timeout)
