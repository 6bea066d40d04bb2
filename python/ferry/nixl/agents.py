"""NIXL agents: make_agent (NIXL's defaults) and agent (UCX settings chosen for
this machine), and the settings each agent was made with."""

from __future__ import annotations

import logging
import os
import threading
import weakref
from typing import Sequence

from ..errors import InvalidArgumentError
from .errors import NixlError
from .library import _nixl_call, nixl


def make_agent(name: str, *, backends: Sequence[str] = ("UCX",), backend_params: dict | None = None,
               progress_thread: bool = True, num_threads: int = 0):
    """A ``nixl_agent`` named `name` with `backends` (UCX by default), each
    created with its entry of `backend_params` ({"UCX": {"ucx_error_handling_mode":
    "none"}}: string values; NIXL's agent.get_plugin_params("UCX") lists them).
    The UCX_* environment variables of this process (UCX_TLS, UCX_NET_DEVICES,
    ...) choose the transports: set them before the first agent."""
    if not name:
        raise InvalidArgumentError("a NIXL agent needs a non-empty name")
    backends = [backends] if isinstance(backends, str) else list(backends)
    params = dict(backend_params or {})
    unknown = set(params) - set(backends)
    if unknown:
        raise InvalidArgumentError(f"backend_params for {sorted(unknown)}, which are not among backends "
                                   f"{list(backends)}")
    module = nixl()
    config = module.nixl_agent_config(enable_prog_thread=progress_thread, backends=[])
    agent = _nixl_call(f"agent creation ({name!r})", module.nixl_agent, name, config)
    for backend in backends:
        if backend not in agent.get_plugin_list():
            raise NixlError(f"NIXL agent {name!r}: no {backend!r} plugin (found: {agent.get_plugin_list()})")
        init = {str(k): str(v) for k, v in params.get(backend, {}).items()}
        if num_threads > 0:
            init.setdefault("num_threads", str(num_threads))
        _nixl_call(f"{backend} backend creation for agent {name!r} with {init}", agent.create_backend, backend, init,
                   hint="NIXL's log above says why; with UCX, UCX_TLS must leave a transport that supports the "
                        "endpoints' error handling (tcp or an RDMA one for 'peer', NIXL's default), or pass "
                        "backend_params={'UCX': {'ucx_error_handling_mode': 'none'}}; where NVIDIA GPUs are "
                        "present NIXL also wants a CUDA transport in UCX_TLS (cuda_copy, or cuda)")
    return agent


log = logging.getLogger("ferry.nixl")
_env_lock = threading.Lock()  # held while agent() sets UCX_* variables for one agent creation
_settings: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # agent -> ucx.Settings


def agent(name: str, *, peers: str = "any", backend_params: dict | None = None, cma: bool | None = None,
          progress_thread: bool = True, num_threads: int = 0):
    """A ``nixl_agent`` with UCX, configured for this machine and traffic.

    peers: where the agents it talks to run: "local" (this host), "remote"
    (other nodes) or "any" (default). UCX's transports are probed once per
    process (ferry.nixl.ucx.probe: a child process, about a second) and
    ferry.nixl.ucx.choose picks UCX_TLS (CUDA transports, shared memory, RDMA, tcp,
    as they start here), UCX_RMA_PPLN_ENABLE=y where GPUs are, 4 MiB
    rendezvous fragments for GPUs and peers on this host, and the
    backend's ``ucx_error_handling_mode`` ("none" where shared-memory or
    cuda_ipc lanes are chosen: they cannot report a dead peer; "peer" for
    remote-only traffic). cma: allow UCX's cma transport between local
    processes (default: only where no CUDA transport starts; see ferry.nixl.ucx).

    Precedence: a UCX_* variable in this process's environment and an entry
    of backend_params ({"UCX": {...}}, as make_agent takes) always win; they
    are reported in ``settings(agent)``. UCX reads its variables when the
    backend is created, so ferry's choices are put into os.environ for that
    call only (under a lock, restored right after): other threads that read
    the environment during those milliseconds see them; later agents,
    make_agent() and child processes do not."""
    from . import ucx

    if not name:
        raise InvalidArgumentError("a NIXL agent needs a non-empty name")
    params = dict(backend_params or {})
    unknown = set(params) - {"UCX"}
    if unknown:
        raise InvalidArgumentError(f"backend_params for {sorted(unknown)}: ferry.nixl.agent creates the UCX "
                                   "backend only (make_agent takes others)")
    nixl()  # NixlUnavailableError before the probe
    chosen = ucx.choose(ucx.probe(), peers=peers, backend_params=params.get("UCX"), cma=cma)
    with _env_lock:
        saved = {k: os.environ.get(k) for k in chosen.env}
        os.environ.update(chosen.env)
        try:
            created = make_agent(name, backend_params={"UCX": dict(chosen.backend_params)},
                                 progress_thread=progress_thread, num_threads=num_threads)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    _settings[created] = chosen
    log.info("NIXL agent %r: %s", name, chosen.describe())
    return created


def settings(a):
    """The ferry.nixl.ucx.Settings that agent() chose for `a` (``.describe()``:
    the text); InvalidArgumentError for an agent that agent() did not make."""
    try:
        return _settings[a]
    except (KeyError, TypeError):
        raise InvalidArgumentError(f"{type(a).__name__} was not made by ferry.nixl.agent(): no settings "
                                   "recorded") from None
