"""The store's exceptions: what callers catch when the SQL history cannot be opened or used."""

from __future__ import annotations


class StoreError(RuntimeError):
    """The store cannot be opened or used; the message names the URL with its password masked."""


class NotFoundError(StoreError, LookupError):
    """A run, attempt or incident id that the store does not hold."""
