"""The process's one object per device (a default loader, a default pinned
pool, the save ring), made on first use and forgotten in a forked child.

Why forgotten: a forked child does not have the parent's objects in any usable
form (their pinned memory is not mapped there: core/fork.h, os/dont_fork.h;
their threads and CUDA state stayed with the parent), so its first use makes
its own. One ``os.register_at_fork`` serves every cache (``_forget_all``); it
also replaces each cache's lock, which another thread of the parent may have
held at the fork and nobody in the child would release.

Locking: ``PerDevice._lock`` guards the making of an entry (one object per key
even when threads ask at once) and ``clear``; ``get`` reads a made entry
without it (a dict lookup under the GIL), the per-tensor path of
``empty_pinned``.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Callable, Generic, Hashable, TypeVar

T = TypeVar("T")

_caches: "weakref.WeakSet[PerDevice]" = weakref.WeakSet()  # every PerDevice, for the fork handler


class PerDevice(Generic[T]):
    """``get(key)``: the object ``make(key)`` made for key (a device index, or
    any hashable: None for a device-less one), made once per process;
    ``peek(key)``: that object if made, else None; ``clear()``: forget all."""

    def __init__(self, make: Callable[[Hashable], T]):
        self._make = make
        self._forget()
        _caches.add(self)

    def get(self, key) -> T:
        made = self._made.get(key)
        if made is not None:
            return made
        with self._lock:
            made = self._made.get(key)
            if made is None:
                made = self._made[key] = self._make(key)
            return made

    def clear(self) -> None:
        """Forget every object (their owners free them once no one uses them)."""
        with self._lock:
            self._made.clear()

    def _forget(self) -> None:
        self._lock = threading.Lock()
        self._made: dict = {}
        # peek(key): the object made for key, or None; makes nothing, takes no lock. The dict's
        # own get, bound: empty_pinned asks it per tensor (a method around it cost 40 ns more).
        self.peek: Callable[[Hashable], T | None] = self._made.get


def _forget_all() -> None:
    for cache in list(_caches):
        cache._forget()


os.register_at_fork(after_in_child=_forget_all)
