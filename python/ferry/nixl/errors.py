"""The errors ferry.nixl raises besides ferry's own: defined in ferry.errors (every
class ferry raises lives there), named here too."""

from __future__ import annotations

from ..errors import NixlError, NixlTimeoutError, NixlUnavailableError  # noqa: F401  (re-exported)

__all__ = ["NixlError", "NixlTimeoutError", "NixlUnavailableError"]
