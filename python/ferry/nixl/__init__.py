"""ferry memory as a NIXL endpoint: pools registered with a ``nixl_agent``,
descriptor lists built from ferry buffers, blocks and tensors, transfers to and
from a remote agent's memory, waited for with a timeout.

NIXL (NVIDIA's inference transfer library, over UCX; what vLLM and Dynamo use
between nodes) is optional: ``pip install 'ferry[nixl]'`` brings ``nixl-cu13``.
Without it this module still imports, its descriptor builders (``descs``,
``slots``, ``blocks``) work, and everything that needs an agent raises
``NixlUnavailableError`` (a ``NotSupportedError``) naming the package.

The pieces, bottom-up:

- ``Descs``: a descriptor list, ``mem_type`` ("DRAM" or "VRAM") and rows of
  (address, nbytes, device); it keeps the objects it was built from alive.
  ``descs(obj)`` (a whole ferry.Buffer, torch tensor, buffer or array),
  ``slots(obj, indices, slot_bytes)`` (equal slots of one object, e.g. KV
  blocks ``tensor[i]``), ``blocks(addresses, lengths, mem_type=...)`` (lists or
  int64 arrays). ``xfer_descs`` / ``reg_descs`` turn one into NIXL's lists.
- ``agent(name)``: a NIXL agent with UCX settings chosen for this machine
  and its traffic (ferry.nixl.ucx: the transports that start here, the fastest set
  for peers on this host and on others, the error handling they allow, UCX's
  RMA pipeline where GPUs are); the user's UCX_* variables and backend_params
  win. ``settings(agent).describe()`` says what was chosen and why (also
  logged at INFO by the "ferry.nixl" logger). ``make_agent`` takes NIXL's
  defaults.
- ``register_pool(agent, pool)``: a ferry ``Pool`` or ``PinnedPool`` (both
  "DRAM") registered chunk by chunk. Its chunks now; ``sync()`` registers the
  chunks the pool added since and deregisters the ones it released (it polls
  ``pool.chunk_generation``, so nothing runs inside the pool). ``register``:
  any other memory (a GPU tensor as "VRAM").
- ``post`` / ``transfer`` / ``read`` / ``write``: one NIXL transfer between
  local and remote descriptor lists; ``Transfer.wait(timeout)`` raises
  ``NixlTimeoutError`` or ``NixlError`` with what, how much and with whom.
  Rows adjacent on both sides are joined into descriptors of up to 2 MiB
  before posting (``coalesce``; ``post(coalesce=False)`` posts them as given):
  UCX pays a rendezvous per descriptor.
- ``publish_metadata`` / ``load_metadata``: an agent's metadata through a file
  (written atomically), for processes on one machine or a shared filesystem.

Keeping registrations in step: a chunk added after a peer loaded this agent's
metadata is unknown to that peer until it loads the metadata again
(``load_metadata`` or ``add_remote_agent`` updates a known agent); a peer
forgets a deregistered chunk only after ``remove_remote_agent`` and a fresh
load. ``sync()`` says what changed. A chunk is released only when no
allocation lies in it, and ``Pool.trim()`` of a plain pool may return free
pages of a used chunk to the OS: then that chunk's generation moves and
``sync()`` registers it again (a registration that pinned the old pages, as
RDMA does, would be stale). ``PinnedPool`` releases whole chunks only.
"""

from __future__ import annotations

from .agents import agent, make_agent, settings
from .descriptors import Descs, blocks, descs, reg_descs, slots, xfer_descs
from .errors import NixlError, NixlTimeoutError, NixlUnavailableError
from .library import available, nixl, unavailable_reason
from .metadata import add_remote, load_metadata, publish_metadata
from .registration import Changes, PoolRegistration, Registration, register, register_pool
from .transfers import COALESCE_BYTES, Transfer, coalesce, post, read, transfer, write

__all__ = [
    "COALESCE_BYTES", "Changes", "Descs", "NixlError", "NixlTimeoutError", "NixlUnavailableError",
    "PoolRegistration", "Registration", "Transfer", "add_remote", "agent", "available", "blocks", "coalesce",
    "descs", "load_metadata", "make_agent", "nixl", "post", "publish_metadata", "read", "reg_descs", "register",
    "register_pool", "settings", "slots", "transfer", "unavailable_reason", "write", "xfer_descs",
]
