"""UCX under NIXL: which transports start on this machine (``probe``), and the
settings ``ferry.nixl.agent`` gives a NIXL agent for its traffic (``choose``).

Why: NIXL's UCX defaults move a ferry pinned pool into another process's GPU at
about 1 GB/s where the link gives 40+ (docs/nixl.md, "UCX settings"): its endpoints
ask for *peer* error handling, which rules out the cuda_ipc and shared-memory
lanes, and UCX's RMA rendezvous protocol (the one that drives cuda_ipc for
host <-> GPU puts and gets) is off unless ``UCX_RMA_PPLN_ENABLE=y``.

- ``probe()`` asks UCX itself, in a short-lived child process with a time limit
  (UCX loads threads and memory hooks into a process; the caller stays free of
  them): the UCX library NIXL bundles is loaded with ctypes, a UCP context is
  created with every transport allowed and ``ucp_context_print_info`` lists the
  transport/device pairs that started (what ``ucx_info -d`` would show; the
  nixl-cu13 wheel ships no ucx_info). The result is cached per process.
- ``choose(probe, peers=..., env=..., backend_params=...)`` is pure (tested
  table-driven on probe results): it returns ``Settings``, the UCX_* variables
  to set while the agent is created, the UCX backend parameters, the user's
  settings that won, why each choice was made, and warnings about user settings
  known to be slow. The user's UCX_* environment variables and backend_params
  always win over ferry's choice. Where CUDA transports start, shared memory is
  ``posix,sysv`` without ``cma``: with cma, UCX_PROTO_INFO on the H200 machine
  shows a push (ucp_put, host -> another process's GPU) of 1 B..8 MiB taking
  cma into the peer's host bounce buffer plus a cuda_copy, where a pull takes
  cuda_ipc; without it both take cuda_ipc (``cma=True`` gives ``sm``). For
  peers on this host with GPUs, rendezvous fragments are 4 MiB for host and
  GPU bounce buffers (UCX_RNDV_FRAG_SIZE=host:4M,cuda:4M; UCX's default host
  fragment is 512K), 16 host fragments per pool chunk so the pinned host pool
  grows by UCX's usual 64 MiB (docs/findings.md, "NIXL over UCX").

Invariants: nothing here imports NIXL or loads UCX into this process; ``choose``
reads no state besides its arguments.
"""

from __future__ import annotations

import dataclasses
import glob
import importlib.util
import json
import os
import re
import subprocess
import sys
from typing import Mapping

from .. import _args
from ..errors import InvalidArgumentError
from .library import MODULES

PEERS = ("any", "local", "remote")
PROBE_TIMEOUT = 30.0  # seconds; UCX starts in ~0.1 s, a Python child in 0.2-3 s on a busy host
ERROR_MODE_PARAM = "ucx_error_handling_mode"
# The variables ferry.nixl.agent may set (a user's own value of any of them wins).
CHOSEN_KEYS = ("UCX_TLS", "UCX_RMA_PPLN_ENABLE", "UCX_RNDV_FRAG_SIZE", "UCX_RNDV_FRAG_ALLOC_COUNT")
# Rendezvous bounce buffers for peers on this host where GPUs are: 4 MiB fragments
# (the best and steadiest variant on the H200 machine, 2026-11-24: READ/WRITE 44.5/40.0
# GB/s at 1 MiB, 41.9/42.0 at 2 MiB), 16 host fragments per chunk: 64 MiB, UCX's
# 128 x 512K, rather than 128 x 4M = 512 MiB of pinned memory per worker.
FRAG_SIZE = "host:4M,cuda:4M"
FRAG_ALLOC_COUNT = "host:16,cuda:128"

# UCX transport names, by family (UCX_TLS aliases: "sm" = the shared-memory ones,
# "cuda" = cuda_copy + cuda_ipc + gdr_copy, "ib" = the verbs ones).
SHM = ("posix", "sysv", "cma", "xpmem", "knem")
CUDA = ("cuda_copy", "cuda_ipc", "gdr_copy")
VERBS_PREFIXES = ("rc_", "dc_", "ud_")
# Transports that cannot report a dead peer: with any of them in use, endpoints
# need error handling "none" (NIXL's "peer" makes UCX leave them out).
NO_PEER_FAILURE = ("posix", "sysv", "cma", "xpmem", "knem", "cuda_ipc")


@dataclasses.dataclass(frozen=True)
class Probe:
    """What UCX starts here: its version and library, transports (name ->
    devices, e.g. {"tcp": ("eth0", "lo"), "cuda_copy": ("cuda",)}), the GPUs
    ferry sees, and the error that stopped the probe (then transports is empty)."""

    version: str | None = None
    library: str | None = None
    transports: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    gpus: int = 0
    error: str | None = None

    def has(self, name: str) -> bool:
        return name in self.transports

    @property
    def verbs(self) -> list[str]:
        return sorted(t for t in self.transports if t.startswith(VERBS_PREFIXES))

    @property
    def tcp_devices(self) -> list[str]:
        """tcp's devices besides loopback (loopback reaches no other node)."""
        return [d for d in self.transports.get("tcp", ()) if d != "lo"]

    def to_dict(self) -> dict:
        return {"version": self.version, "library": self.library, "gpus": self.gpus, "error": self.error,
                "transports": {k: list(v) for k, v in sorted(self.transports.items())}}

    def summary(self) -> str:
        if self.error:
            return f"probe failed: {self.error}"
        return ", ".join(f"{t} ({'/'.join(d)})" for t, d in sorted(self.transports.items())) or "none"


# ---- finding UCX and asking it ----------------------------------------------------


def nixl_module_specs():
    """(name, import spec) of each NIXL module that is installed, in
    library.MODULES order; found on the import path, nothing imported."""
    for name in MODULES:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        if spec is not None and spec.origin:
            yield name, spec


def library_path() -> str | None:
    """libucp of the NIXL that ferry.nixl would import (the wheel's bundled copy
    in <site>/nixl_cu13.libs), else the system's libucp.so.0, else None. Finds
    files only: nothing is imported or loaded."""
    for name, spec in nixl_module_specs():
        site = os.path.dirname(os.path.dirname(spec.origin))
        found = sorted(glob.glob(os.path.join(site, f"{name}.libs", "libucp*.so*")))
        if found:
            return found[0]
    import ctypes.util

    return ctypes.util.find_library("ucp")


# Run in the probe's child: argv[1] is libucp's path; prints one JSON line.
_PROBE_CHILD = r"""
import ctypes, json, os, sys, tempfile
lib = ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)
lib.ucp_get_version_string.restype = ctypes.c_char_p
major, minor, release = ctypes.c_uint(), ctypes.c_uint(), ctypes.c_uint()
lib.ucp_get_version(ctypes.byref(major), ctypes.byref(minor), ctypes.byref(release))
config, context = ctypes.c_void_p(), ctypes.c_void_p()
status = lib.ucp_config_read(None, None, ctypes.byref(config))
if status != 0:
    raise SystemExit(f"ucp_config_read failed with status {status}")
params = (ctypes.c_uint64 * 64)()  # ucp_params_t, zeroed; larger than any version of it
params[0] = 1                      # field_mask = UCP_PARAM_FIELD_FEATURES
params[1] = (1 << 1) | (1 << 6)    # features = UCP_FEATURE_RMA | UCP_FEATURE_AM (what NIXL asks)
status = lib.ucp_init_version(major, minor, params, config, ctypes.byref(context))
if status != 0:
    raise SystemExit(f"ucp_init failed with status {status}")
libc = ctypes.CDLL(None)
libc.fopen.restype = ctypes.c_void_p
libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
libc.fclose.argtypes = [ctypes.c_void_p]
lib.ucp_context_print_info.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
fd, path = tempfile.mkstemp(prefix="ferry-ucx-")
os.close(fd)
stream = libc.fopen(path.encode(), b"w")
lib.ucp_context_print_info(context, stream)
libc.fclose(stream)
with open(path) as f:
    info = f.read()
os.unlink(path)
lib.ucp_cleanup(context)
print(json.dumps({"version": lib.ucp_get_version_string().decode(), "info": info}), flush=True)
"""

_RESOURCE = re.compile(r"resource\s+\d+\s*:.*--\s*([A-Za-z0-9_]+)/(\S+)")


def parse_context_info(text: str) -> dict[str, tuple[str, ...]]:
    """{transport: (device, ...)} from ucp_context_print_info's "resource N : md
    M dev D flags -- tl/device" lines."""
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        m = _RESOURCE.search(line)
        if m:
            found.setdefault(m.group(1), []).append(m.group(2))
    return {k: tuple(v) for k, v in found.items()}


def _gpu_count() -> int:
    from .. import _ferry, measure

    info = _ferry.cuda_info()
    return 0 if measure.gpu_absent_reason(info) else len((info or {}).get("devices") or [])


def run_probe(library: str | None = None, timeout: float = PROBE_TIMEOUT, gpus: int | None = None) -> Probe:
    """Probe UCX now (a child process, at most `timeout` s; None or math.inf: no
    limit): every transport is allowed in it (the caller's UCX_TLS and
    UCX_NET_DEVICES are dropped there)."""
    timeout = _args.timeout(timeout, "timeout")
    gpus = _gpu_count() if gpus is None else gpus
    library = library or library_path()
    if not library:
        return Probe(gpus=gpus, error="no UCX library found (NIXL is not installed, and no libucp.so)")
    env = {k: v for k, v in os.environ.items() if k not in ("UCX_TLS", "UCX_NET_DEVICES", "UCX_LOG_LEVEL")}
    env["UCX_LOG_LEVEL"] = "error"
    try:
        r = subprocess.run([sys.executable, "-c", _PROBE_CHILD, library], capture_output=True, text=True,
                           timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return Probe(library=library, gpus=gpus, error=f"UCX did not start within {timeout:g} s")
    last = (r.stdout.strip().splitlines() or [""])[-1]
    try:
        result = json.loads(last)
    except ValueError:
        why = (r.stderr.strip().splitlines() or [f"exit status {r.returncode}"])[-1]
        return Probe(library=library, gpus=gpus, error=f"UCX context creation failed: {why}")
    return Probe(version=result["version"], library=library, transports=parse_context_info(result["info"]),
                 gpus=gpus)


_cache: dict[str, Probe] = {}


def probe(refresh: bool = False, timeout: float = PROBE_TIMEOUT) -> Probe:
    """run_probe(), once per process (refresh=True probes again)."""
    _args.timeout(timeout, "timeout")  # refused even when the probe is cached
    key = library_path() or ""
    if refresh or key not in _cache:
        _cache[key] = run_probe(key or None, timeout)
    return _cache[key]


# ---- the choice ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Settings:
    """What ferry.nixl.agent() gives a NIXL agent.

    env: UCX_* variables set while the agent is created (ferry's choices only;
    a variable the user set is never touched); backend_params: the UCX
    backend's parameters (ferry's choices with the user's on top); user: the
    user's own UCX settings that won ({"UCX_TLS": ..., "backend_params.X": ...});
    reasons: why each choice; warnings: user settings known to be slow here,
    each {"setting", "problem", "fix"}."""

    peers: str
    env: Mapping[str, str]
    backend_params: Mapping[str, str]
    user: Mapping[str, str]
    reasons: tuple[str, ...]
    warnings: tuple[Mapping[str, str], ...]
    probe: Probe

    @property
    def error_handling(self) -> str:
        return self.backend_params.get(ERROR_MODE_PARAM, "peer")

    @property
    def effective_env(self) -> dict[str, str]:
        """The UCX_* settings the agent runs with: ferry's and the user's."""
        return {**self.env, **{k: v for k, v in self.user.items() if k.startswith("UCX_")}}

    def describe(self) -> str:
        """Several lines: what was chosen, from what, and why."""
        env = self.effective_env
        chosen = ", ".join(f"{k}={v}" for k, v in sorted(self.env.items())) or "none"
        user = ", ".join(f"{k}={v}" for k, v in sorted(self.user.items())) or "none"
        p = self.probe
        lines = [
            f"ferry.nixl agent settings for {self.peers} peers (UCX {p.version or 'unknown'}, "
            f"{p.gpus} GPU{'s' if p.gpus != 1 else ''})",
            f"  transports that start: {p.summary()}",
            f"  UCX_TLS={env.get('UCX_TLS', '(UCX default: all)')}, error handling {self.error_handling}, "
            f"RMA pipeline {env.get('UCX_RMA_PPLN_ENABLE', '(UCX default: n)')}, rendezvous fragments "
            f"{env.get('UCX_RNDV_FRAG_SIZE', '(UCX default: host:512K,cuda:4M)')}",
            f"  set by ferry: {chosen}",
            f"  the user's (they win): {user}",
        ]
        lines += [f"  why: {r}" for r in self.reasons]
        lines += [f"  warning: {w['setting']}: {w['problem']}; fix: {w['fix']}" for w in self.warnings]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"peers": self.peers, "env": dict(self.env), "backend_params": dict(self.backend_params),
                "user": dict(self.user), "effective_env": self.effective_env,
                "error_handling": self.error_handling, "reasons": list(self.reasons),
                "warnings": [dict(w) for w in self.warnings], "probe": self.probe.to_dict()}


def _tls_names(value: str, probe: Probe) -> set[str]:
    """The transports a UCX_TLS value allows, aliases expanded ("sm", "cuda",
    "ib", "all", "^x,y" = all but x and y); unknown names stay as they are."""
    tokens = [t.strip() for t in value.split(",") if t.strip()]
    negate = bool(tokens) and tokens[0].startswith("^")
    if negate:
        tokens[0] = tokens[0][1:]
    names: set[str] = set()
    for t in tokens:
        if t == "all":
            names |= set(probe.transports) | set(SHM) | set(CUDA) | {"tcp", "self"}
        elif t == "sm" or t == "shm":
            names |= set(SHM)
        elif t == "cuda":
            names |= set(CUDA)
        elif t in ("ib", "rc", "dc", "ud", "rc_x", "dc_x", "ud_x", "rc_v", "ud_v"):
            names |= {x for x in probe.verbs} | {t}
        else:
            names.add(t)
    if negate:
        return (set(probe.transports) | set(SHM) | set(CUDA) | {"tcp", "self"}) - names
    return names


def _pick_tls(probe: Probe, peers: str, cma: bool | None) -> tuple[list[str], list[str]]:
    """(UCX_TLS entries, reasons) for this probe and traffic."""
    reasons = []
    cuda = [t for t in ("cuda_copy", "cuda_ipc") if probe.has(t)]
    shm = any(probe.has(t) for t in SHM)
    local, remote = [], []
    if peers in ("any", "local"):
        if cuda:
            reasons.append(f"{' and '.join(cuda)}: GPU memory of other processes on this host "
                           "(cuda_ipc maps it; the RMA pipeline drives it)")
        if cma is None:
            cma = not cuda
        shm_names = [t for t in ("posix", "sysv") if probe.has(t)]
        if shm and (cma or not shm_names):
            local.append("sm")
            reasons.append("sm: host memory between processes of this host (shared memory, cma)")
        elif shm:
            local += shm_names
            reasons.append(f"{','.join(shm_names)} without cma: shared memory for messages; cma (a CPU copy "
                           "between processes) is left out where GPUs are: with it UCX pushes pinned host "
                           "memory into another process's GPU by cma into the peer's host bounce buffer plus "
                           "a cuda_copy (UCX_PROTO_INFO, H200 machine), without it by cuda_ipc like a pull; "
                           "agent(cma=True) puts it back")
    if peers in ("any", "remote"):
        if probe.verbs:
            remote.append("ib")
            reasons.append(f"ib: RDMA to other nodes ({', '.join(probe.verbs)} started)")
        if probe.tcp_devices:
            remote.append("tcp")
            reasons.append(f"tcp: other nodes over {', '.join(probe.tcp_devices)}"
                           + (" (a fallback beside RDMA)" if probe.verbs else ""))
    if not (local or remote) and probe.has("tcp"):
        remote.append("tcp")  # loopback only: still a transport for active messages
        reasons.append("tcp on loopback: the only transport for NIXL's messages that starts here")
    if not (local or remote):
        return [], reasons + ["no transport for NIXL's messages starts (no shared memory, tcp or RDMA): "
                              "UCX_TLS is left to UCX"]
    if probe.has("gdr_copy") and probe.gpus:
        cuda.append("gdr_copy")
    return cuda + local + remote + ["self"], reasons


def _slow_settings(user_env: Mapping[str, str], user_params: Mapping[str, str], probe: Probe,
                   tls: set[str], peers: str) -> list[dict]:
    """Warnings for the user's settings that are known to be slow here."""
    warnings = []
    if not probe.gpus:
        return warnings
    user_tls = user_env.get("UCX_TLS")
    if user_tls is not None and not tls & {"cuda_copy", "cuda_ipc"}:
        warnings.append({"setting": f"UCX_TLS={user_tls}",
                         "problem": "no CUDA transport on a GPU machine: NIXL refuses to create the agent "
                                    "(\"Add cuda_copy\") and GPU memory cannot move",
                         "fix": "unset UCX_TLS (ferry.nixl.agent picks cuda_copy,cuda_ipc,sm,...) or add "
                                "cuda_copy,cuda_ipc"})
    elif user_tls is not None and peers != "remote" and "cuda_ipc" not in tls:
        warnings.append({"setting": f"UCX_TLS={user_tls}",
                         "problem": "no cuda_ipc: GPU memory of another process on this host moves through "
                                    "host copies (about 1 GB/s measured on the H200 machine, 40 with cuda_ipc)",
                         "fix": "add cuda_ipc to UCX_TLS, or unset it"})
    ppln = user_env.get("UCX_RMA_PPLN_ENABLE")
    if ppln is not None and ppln.strip().lower() in ("n", "no", "0", "off", "false"):
        warnings.append({"setting": f"UCX_RMA_PPLN_ENABLE={ppln}",
                         "problem": "UCX's RMA rendezvous protocol is off: host <-> GPU transfers between "
                                    "processes fall back to software emulation (0.9 vs 40 GB/s measured)",
                         "fix": "unset UCX_RMA_PPLN_ENABLE (ferry.nixl.agent sets it to y)"})
    mode = user_params.get(ERROR_MODE_PARAM)
    if mode == "peer" and peers != "remote" and tls & {"cuda_ipc", "posix", "sysv", "cma"}:
        warnings.append({"setting": f"backend_params {ERROR_MODE_PARAM}=peer",
                         "problem": "peer error handling rules out the cuda_ipc and shared-memory lanes "
                                    "between processes of this host (0.9 vs 40 GB/s measured)",
                         "fix": f"{ERROR_MODE_PARAM}=none for traffic inside one host"})
    return warnings


def choose(probe: Probe, *, peers: str = "any", env: Mapping[str, str] | None = None,
           backend_params: Mapping[str, str] | None = None, cma: bool | None = None) -> Settings:
    """The settings for an agent whose peers are on this host ("local"), on
    other nodes ("remote") or both ("any"), given what `probe` found. `env`
    (default os.environ): the user's UCX_* variables win; `backend_params`
    (the UCX backend's): the user's win. `cma`: allow UCX's cma transport
    between local processes (None: only where no CUDA transport starts). Pure."""
    if peers not in PEERS:
        raise InvalidArgumentError(f"peers={peers!r}: expected one of {', '.join(PEERS)}")
    env = os.environ if env is None else env
    user_env = {k: str(v) for k, v in env.items() if k.startswith("UCX_")}
    user_params = {str(k): str(v) for k, v in (backend_params or {}).items()}
    chosen: dict[str, str] = {}
    reasons: list[str] = []
    if probe.error:
        reasons.append(f"UCX probe failed ({probe.error}): UCX_TLS is left to UCX")
        tls_list: list[str] = []
    else:
        tls_list, why = _pick_tls(probe, peers, cma)
        reasons += why
    if tls_list:
        chosen["UCX_TLS"] = ",".join(tls_list)
    if probe.gpus and (probe.has("cuda_copy") or probe.error):
        chosen["UCX_RMA_PPLN_ENABLE"] = "y"
        reasons.append("UCX_RMA_PPLN_ENABLE=y: enables UCX's RMA rendezvous protocol, which moves host memory "
                       "to and from GPUs of other processes through cuda_ipc and GPU staging (40 GB/s vs 0.9 "
                       "without, H200 machine)")
    if probe.gpus and peers != "remote" and (probe.has("cuda_ipc") or probe.error):
        chosen["UCX_RNDV_FRAG_SIZE"] = FRAG_SIZE
        if "UCX_RNDV_FRAG_SIZE" not in user_env:  # the count goes with ferry's size, not the user's
            chosen["UCX_RNDV_FRAG_ALLOC_COUNT"] = FRAG_ALLOC_COUNT
        reasons.append(f"UCX_RNDV_FRAG_SIZE={FRAG_SIZE}, UCX_RNDV_FRAG_ALLOC_COUNT={FRAG_ALLOC_COUNT}: 4 MiB "
                       "rendezvous bounce buffers (UCX's host default is 512K) were the best and steadiest "
                       "variant between processes on the H200 machine (READ/WRITE >= 40 GB/s at 1 and 2 MiB "
                       "blocks); 16 host fragments per pool chunk keep its pinned growth at UCX's 64 MiB")
    env_out = {k: v for k, v in chosen.items() if k not in user_env}
    reasons += [f"{k}: the user's {user_env[k]!r} wins over ferry's {v!r}" for k, v in chosen.items() if k in user_env]
    tls_value = user_env.get("UCX_TLS", chosen.get("UCX_TLS"))
    tls = _tls_names(tls_value, probe) if tls_value else set(probe.transports) | {"self"}
    params: dict[str, str] = {}
    lanes = sorted(tls & set(NO_PEER_FAILURE) & (set(probe.transports) or set(NO_PEER_FAILURE)))
    if peers == "remote" or not lanes:
        params[ERROR_MODE_PARAM] = "peer"
        reasons.append("error handling peer: every chosen transport reports a dead peer "
                       "(NIXL_ERR_REMOTE_DISCONNECT)")
    else:
        params[ERROR_MODE_PARAM] = "none"
        reasons.append(f"error handling none: {', '.join(lanes)} cannot report a dead peer, and NIXL's "
                       "default (peer) would leave them out; a dead peer shows as a transfer timeout")
    params.update(user_params)
    user = {**{k: v for k, v in user_env.items()},
            **{f"backend_params.{k}": v for k, v in user_params.items()}}
    warnings = _slow_settings(user_env, user_params, probe, tls, peers)
    return Settings(peers=peers, env=env_out, backend_params=params, user=user, reasons=tuple(reasons),
                    warnings=tuple(warnings), probe=probe)


__all__ = ["CHOSEN_KEYS", "PEERS", "Probe", "Settings", "choose", "library_path", "parse_context_info", "probe",
           "run_probe"]
