"""NIXL's Python module: found and imported once, and NIXL calls whose errors
become NixlError."""

from __future__ import annotations

import importlib

from ..errors import FerryError
from .errors import NixlError, NixlUnavailableError

# NIXL's Python modules, in the order they are tried: the CUDA 13 and 12 wheels
# (nixl-cu13, nixl-cu12), then the `nixl` meta package or a source build
# (ferry.nixl.ucx finds UCX through them).
MODULES = ("nixl_cu13", "nixl_cu12", "nixl")
INSTALL_HINT = "pip install 'ferry[nixl]' (or: pip install nixl-cu13; nixl-cu12 for CUDA 12)"


_module = None
_import_error: str | None = None


def nixl():
    """NIXL's Python module (nixl_cu13, nixl_cu12 or nixl, the first that
    imports); raises NixlUnavailableError naming the package to install."""
    global _module, _import_error
    if _module is not None:
        return _module
    if _import_error is None:
        failures = []
        for name in MODULES:
            try:
                module = importlib.import_module(name)
                module.nixl_agent  # a source tree's `nixl` directory is no agent
            except Exception as e:  # ImportError, or a bundled library that does not load
                failures.append(f"{name}: {type(e).__name__}: {e}")
                continue
            _module = module
            return module
        _import_error = "; ".join(failures)
    raise NixlUnavailableError(f"ferry.nixl needs NIXL's Python package: {INSTALL_HINT}. "
                               f"Importing it failed ({_import_error})")


def available() -> bool:
    """True when NIXL's Python package imports."""
    return unavailable_reason() is None


def unavailable_reason() -> str | None:
    """Why NIXL cannot be used here, or None."""
    try:
        nixl()
    except NixlUnavailableError as e:
        return str(e)
    return None


def _nixl_call(what: str, fn, *args, hint: str = ""):
    """fn(*args), a NIXL failure becoming NixlError("NIXL <what> failed: ...")."""
    try:
        return fn(*args)
    except FerryError:
        raise
    except Exception as e:  # NIXL's binding errors (nixlNotFoundError, ...) derive from Exception
        name = type(e).__name__
        detail = str(e) if str(e) and str(e) != name else ""
        message = f"NIXL {what} failed: {name}" + (f" ({detail})" if detail else "")
        raise NixlError(message + (f"; {hint}" if hint else "")) from e
