"""An agent's metadata: added to a peer, published to and loaded from a file."""

from __future__ import annotations

import json
import os
import time

from .. import _args
from .descriptors import _agent
from .errors import NixlTimeoutError
from .library import _nixl_call


def add_remote(agent, metadata: bytes) -> str:
    """Load a remote agent's metadata into `agent` (a known agent is updated:
    regions it registered since are added); returns its name as a str."""
    _agent(agent, "add_remote")
    name = _nixl_call("add_remote_agent", agent.add_remote_agent, metadata)
    return name.decode() if isinstance(name, bytes) else name


def publish_metadata(agent, path: str | os.PathLike, extra: dict | None = None) -> None:
    """Write `agent`'s metadata (and `extra`, JSON: e.g. where its blocks are)
    to `path`, atomically: a reader sees the whole file or none."""
    _agent(agent, "publish_metadata")
    metadata = _nixl_call("get_agent_metadata", agent.get_agent_metadata)
    document = {"agent": agent.name, "metadata": metadata.hex(), "extra": extra or {}}
    tmp = f"{os.fspath(path)}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(document, f)
    os.replace(tmp, path)


def load_metadata(agent, path: str | os.PathLike, timeout: float = 60.0) -> tuple[str, dict]:
    """Wait (up to `timeout` s; None or math.inf: no limit) for a file
    publish_metadata() wrote, add that agent to `agent` (a known agent is
    updated) and return (its name, extra)."""
    limit = _args.timeout(timeout, "timeout")
    _agent(agent, "load_metadata")
    deadline = None if limit is None else time.monotonic() + limit
    while not os.path.exists(path):
        if deadline is not None and time.monotonic() > deadline:
            raise NixlTimeoutError(f"no NIXL metadata at {os.fspath(path)!r} after {timeout:g} s: "
                                   "did the peer process start and publish it?")
        time.sleep(0.01)
    with open(path) as f:
        document = json.load(f)
    name = _nixl_call(f"add_remote_agent ({document.get('agent')!r} from {os.fspath(path)!r})",
                      add_remote, agent, bytes.fromhex(document["metadata"]))
    return name, document.get("extra", {})
