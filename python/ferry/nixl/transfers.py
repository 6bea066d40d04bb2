"""Transfers between local and remote descriptor lists: post, transfer, read,
write, the Transfer waited for, and coalesce (adjacent rows joined)."""

from __future__ import annotations

import time
from typing import Sequence

from .. import _args
from ..errors import InvalidArgumentError
from .descriptors import Descs, _agent, _count, descs, xfer_descs
from .errors import NixlError, NixlTimeoutError
from .library import _nixl_call
from .registration import PoolRegistration

OPERATIONS = ("READ", "WRITE")



def _as_descs(d, what: str) -> Descs:
    if isinstance(d, Descs):
        return d
    try:
        return descs(d)
    except InvalidArgumentError as e:
        raise InvalidArgumentError(f"{what}: {e}") from None


def _check_pair(local: Descs, remote: Descs) -> None:
    if not local:
        raise InvalidArgumentError("no descriptors: a transfer needs at least one")
    if len(local) != len(remote):
        raise InvalidArgumentError(f"{len(local)} local descriptors but {len(remote)} remote ones: "
                                   "a transfer pairs them one to one")
    for i, ((_, a, _), (_, b, _)) in enumerate(zip(local.rows, remote.rows)):
        if a != b:
            raise InvalidArgumentError(f"descriptor {i}: {a} bytes locally, {b} remotely: paired descriptors "
                                       "have the same length")


class Transfer:
    """A posted NIXL transfer. wait(timeout) until it is done; done (a poll);
    release() frees its handle (aborting it if still running); repost() runs
    the same transfer again. A context manager that releases on exit.
    ``parts``: the NIXL requests it was posted as (post(split=N)); ``posted``:
    the descriptors posted, after post() joined adjacent ones (coalesce)."""

    def __init__(self, agent, handles, op: str, local: Descs, remote: Descs, remote_agent: str,
                 posted: int | None = None):
        _agent(agent, "Transfer")
        self.agent = agent
        self.op = op
        self.local = local  # held: their memory stays alive while the transfer may run
        self.remote = remote
        self.remote_agent = remote_agent
        self.posted = len(local) if posted is None else posted  # descriptors posted (after coalescing)
        self._handles = list(handles) if isinstance(handles, (list, tuple)) else [handles]
        self._handle = self._handles[0]
        self._posted = 0.0
        self.seconds: float | None = None  # post to done, as seen by done/wait

    @property
    def nbytes(self) -> int:
        return self.local.nbytes

    @property
    def backend(self) -> str:
        """The NIXL backend that runs this transfer (e.g. "UCX")."""
        if self._handle is None:
            raise InvalidArgumentError("this transfer was released")
        return _nixl_call("query_xfer_backend", self.agent.query_xfer_backend, self._handle)

    @property
    def parts(self) -> int:
        return len(self._handles)

    def _what(self) -> str:
        arrow, direction = ("<-", "from") if self.op == "READ" else ("->", "to")
        return (f"NIXL {self.op} of {self.nbytes} bytes ({len(self.local)} descriptor(s), {self.local.mem_type} "
                f"{arrow} {self.remote.mem_type}) {direction} agent {self.remote_agent!r}")

    def _post(self, notif: bytes) -> None:
        if self._handle is None:
            raise InvalidArgumentError("this transfer was released")
        self.seconds = None
        self._posted = time.perf_counter()
        states = [_nixl_call(f"post of {self._what()}", self.agent.transfer, h, notif) for h in self._handles]
        self._settle(states)

    def repost(self, notif: bytes = b"") -> "Transfer":
        """Post the same transfer again (after it is done)."""
        if not self.done:
            raise InvalidArgumentError(f"{self._what()} is still running: wait() before repost()")
        self._post(notif)
        return self

    def _settle(self, states: list[str]) -> bool:
        bad = [s for s in states if s not in ("DONE", "PROC")]
        if not bad and all(s == "DONE" for s in states):
            if self.seconds is None:
                self.seconds = time.perf_counter() - self._posted
            return True
        if not bad:
            return False
        raise NixlError(f"{self._what()} failed (state {bad[0]}); NIXL's log above says why "
                        "(for UCX: the peer may be gone, or no transport both sides share reaches this memory)")

    @property
    def done(self) -> bool:
        """True once the transfer completed; raises NixlError if it failed."""
        if self.seconds is not None:
            return True
        if self._handle is None:
            raise InvalidArgumentError("this transfer was released")
        return self._settle([_nixl_call(f"check_xfer_state of {self._what()}", self.agent.check_xfer_state, h)
                             for h in self._handles])

    def wait(self, timeout: float | None = 60.0) -> "Transfer":
        """Block until done (polling NIXL, which also drives its progress);
        NixlTimeoutError after `timeout` seconds (None: no limit) with the
        transfer still posted, NixlError if it failed. None or math.inf: no limit;
        negative or NaN: InvalidArgumentError."""
        timeout = _args.timeout(timeout, "timeout")
        start = time.perf_counter()
        pause = 0.0
        while not self.done:
            waited = time.perf_counter() - start
            if timeout is not None and waited > timeout:
                raise NixlTimeoutError(f"{self._what()} not done after {timeout:g} s; it is still posted "
                                       "(release() aborts it). Is the peer alive, and do both sides' UCX_TLS "
                                       "share a transport for this memory?")
            # Spin for the first millisecond (a transfer of a few MiB is done by then), then back off to 1 ms.
            if waited > 1e-3:
                pause = min(1e-3, max(2e-5, pause * 2))
                time.sleep(pause)
        return self

    def release(self) -> None:
        """Free the NIXL handle (aborting a running transfer); idempotent."""
        if self._handle is not None:
            handles, self._handles, self._handle = self._handles, [], None
            for handle in handles:
                _nixl_call(f"release_xfer_handle of {self._what()}", self.agent.release_xfer_handle, handle)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


COALESCE_BYTES = 2 << 20  # post()'s default cap on a joined descriptor (see coalesce)


def coalesce(local: Descs, remote: Descs, max_bytes: int = COALESCE_BYTES) -> tuple[Descs, Descs]:
    """Pairs of rows that continue each other on BOTH sides joined into one
    pair: (local row, remote row) pairs are taken in local-address order, and
    a pair whose local and remote memory start where the previous pair's end
    (same devices) is appended to it while the joined length stays within
    `max_bytes`. Every local byte still pairs with the same remote byte, so a
    transfer of the result moves exactly what the original moves; rows that
    are not adjacent on both sides stay separate, and a row longer than
    max_bytes stays whole. Returns (local, remote) themselves when nothing
    joins. Why: UCX runs each descriptor as its own rendezvous (a handshake per
    descriptor), which caps 64 KiB blocks at ~5 GB/s on the H200 machine where
    2 MiB ones reach 40+; a KV offload of consecutive blocks joins into few
    large descriptors. Pure (no NIXL)."""
    _check_pair(local, remote)
    max_bytes = _count(max_bytes, "max_bytes")
    n = len(local.rows)
    if n < 2 or max_bytes == 0:
        return local, remote
    lrows, rrows = local.rows, remote.rows
    order = sorted(range(n), key=lambda k: lrows[k][0])
    out_l, out_r = [], []
    la, ln, ld = lrows[order[0]]
    ra, _, rd = rrows[order[0]]
    for k in order[1:]:
        a, m, d = lrows[k]
        b, _, e = rrows[k]
        if a == la + ln and b == ra + ln and d == ld and e == rd and ln + m <= max_bytes:
            ln += m
            continue
        out_l.append((la, ln, ld))
        out_r.append((ra, ln, rd))
        la, ln, ld, ra, rd = a, m, d, b, e
    out_l.append((la, ln, ld))
    out_r.append((ra, ln, rd))
    if len(out_l) == n:
        return local, remote
    return (Descs._checked(local.mem_type, out_l, local._owners),
            Descs._checked(remote.mem_type, out_r, remote._owners))


_join = coalesce  # post()'s argument of that name hides the function there


def _split_rows(d: Descs, parts: int) -> list[Descs]:
    """d's rows in `parts` contiguous groups of nearly equal row counts."""
    n = len(d.rows)
    bounds = [n * k // parts for k in range(parts + 1)]
    return [Descs(d.mem_type, d.rows[a:b], d._owners) for a, b in zip(bounds, bounds[1:]) if b > a]


def _coalesce_limit(value) -> int:
    """post()'s coalesce= as a byte cap (0: off)."""
    if value is True:
        return COALESCE_BYTES
    if value is False or value is None:
        return 0
    return _count(value, "coalesce")


def _remote_covers(agent, remote_agent: str, remote: Descs) -> bool:
    """Whether each of `remote`'s rows lies inside one region of the remote
    agent's metadata as loaded here (NIXL's check, quiet; True where this NIXL
    has no such check: initialize_xfer's failure is the fallback then)."""
    check = getattr(agent, "check_remote_metadata", None)
    if check is None:
        return True
    try:
        return bool(check(remote_agent, xfer_descs(agent, remote)))
    except Exception:
        return True


def _initialize(agent, op: str, local: Descs, remote: Descs, remote_agent: str, notif: bytes, backends,
                split: int) -> list:
    """NIXL request handles for local/remote in min(split, rows) contiguous parts
    (none left behind on failure)."""
    hint = ("NIXL_ERR_NOT_FOUND means a descriptor lies outside the memory registered here or in the "
            "remote agent's metadata as loaded (register it; the peer loads the metadata again)")
    parts = min(split, len(local))
    handles = []
    try:
        for part_local, part_remote in zip(_split_rows(local, parts), _split_rows(remote, parts)):
            handles.append(_nixl_call(f"initialize_xfer ({op} of {part_local.nbytes} bytes, {len(part_local)} "
                                      f"descriptor(s), with agent {remote_agent!r})", agent.initialize_xfer, op,
                                      xfer_descs(agent, part_local), xfer_descs(agent, part_remote), remote_agent,
                                      notif, list(backends), hint=hint))
    except BaseException:
        for h in handles:
            try:
                agent.release_xfer_handle(h)
            except Exception:
                pass  # the initialize error says more
        raise
    return handles


def post(agent, op: str, local, remote, remote_agent: str, *, notif: bytes = b"",
         backends: Sequence[str] = (), sync: PoolRegistration | Sequence[PoolRegistration] = (),
         split: int = 1, coalesce: int | bool = True) -> Transfer:
    """Start one transfer: op "READ" (remote -> local) or "WRITE" (local ->
    remote); local and remote are Descs (or objects descs() takes) paired row by
    row; remote rows are addresses in the remote agent's memory. `sync`: pool
    registrations to bring up to date first (so new chunks are registered).

    coalesce: join pairs of rows that are adjacent on both sides into larger
    descriptors before posting (ferry.nixl.coalesce; True: up to
    COALESCE_BYTES = 2 MiB each, an int: that cap in bytes, False or 0: post
    the rows as given). The bytes moved are the same; consecutive 64 KiB KV
    blocks move as 2 MiB descriptors (docs/nixl.md). A joined row must lie in
    one registered region on each side: the remote side is checked against
    the peer's metadata first, and if NIXL still refuses the joined lists
    (local rows adjacent across two registrations) the rows are posted as
    given. ``Transfer.posted`` says how many descriptors went out.

    split: post the rows as up to that many NIXL requests at once (contiguous
    groups; one Transfer waits for all; notif goes with each part). Measured
    on the H200 machine: no gain (scripts/gpu-nixl-write, docs/findings.md)."""
    if op not in OPERATIONS:
        raise InvalidArgumentError(f"op={op!r}: expected READ or WRITE")
    local = _as_descs(local, "local")
    remote = _as_descs(remote, "remote")
    _check_pair(local, remote)
    split = _count(split, "split")
    if split < 1:
        raise InvalidArgumentError("split=0: a transfer is posted as at least one request")
    limit = _coalesce_limit(coalesce)
    _agent(agent, "post")  # after the request's checks (they need no agent)
    if isinstance(remote_agent, bytes):
        remote_agent = remote_agent.decode()
    for registration in [sync] if isinstance(sync, PoolRegistration) else sync:
        registration.sync()
    post_local, post_remote = _join(local, remote, limit) if limit else (local, remote)
    if post_local is not local and not _remote_covers(agent, remote_agent, post_remote):
        post_local, post_remote = local, remote  # a joined row spans two of the peer's regions
    try:
        handles = _initialize(agent, op, post_local, post_remote, remote_agent, notif, backends, split)
    except NixlError:
        if post_local is local:
            raise
        post_local, post_remote = local, remote  # a joined row spans two local registrations
        handles = _initialize(agent, op, local, remote, remote_agent, notif, backends, split)
    t = Transfer(agent, handles, op, local, remote, remote_agent, posted=len(post_local))
    try:
        t._post(notif)
    except BaseException:
        try:
            t.release()
        except NixlError:
            pass  # the post's error says more
        raise
    return t


def transfer(agent, op: str, local, remote, remote_agent: str, *, timeout: float | None = 60.0,
             notif: bytes = b"", backends: Sequence[str] = (), sync=(), split: int = 1,
             coalesce: int | bool = True) -> Transfer:
    """post() and wait(timeout); returns the done Transfer (``seconds``: post to
    done). Release it (or use it in a with block) when not reposting it."""
    _args.timeout(timeout, "timeout")  # refused before anything is posted
    t = post(agent, op, local, remote, remote_agent, notif=notif, backends=backends, sync=sync, split=split,
             coalesce=coalesce)
    try:
        return t.wait(timeout)
    except NixlTimeoutError:
        raise  # still posted: the caller decides (release() aborts)
    except BaseException:
        t.release()
        raise


def read(agent, local, remote, remote_agent: str, **kwargs) -> Transfer:
    """transfer(agent, "READ", ...): remote memory into local memory."""
    return transfer(agent, "READ", local, remote, remote_agent, **kwargs)


def write(agent, local, remote, remote_agent: str, **kwargs) -> Transfer:
    """transfer(agent, "WRITE", ...): local memory into remote memory."""
    return transfer(agent, "WRITE", local, remote, remote_agent, **kwargs)
