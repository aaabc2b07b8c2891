"""Accounts: who is asking (``Viewer``), passwords, and the user directory over the store."""

from __future__ import annotations
