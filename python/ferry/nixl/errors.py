"""The errors ferry.nixl raises besides ferry's own."""

from __future__ import annotations

from ..errors import FerryError, NotSupportedError


class NixlUnavailableError(NotSupportedError):
    """NIXL's Python package is not installed or does not load."""


class NixlError(FerryError, RuntimeError):
    """A NIXL call failed or a transfer ended in error; the message says which."""


class NixlTimeoutError(NixlError, TimeoutError):
    """A transfer was not done within its timeout (it stays posted)."""
