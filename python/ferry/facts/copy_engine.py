"""The copy engine's settings on this host, read the way the engine reads them:
how many threads its crew of copy threads has, and which machine profile file
it reads (if any). Neither needs CUDA.

The rules are the engine's, restated here for a process that has no engine:
  - crew size (src/copy/copy_crew.cpp, copy_crew): FERRY_COPY_WORKERS threads
    when set above 0, else one per CPU the crew may use, at most 16
    (kDefaultThreadCap, src/core/thread_counts.h), counting the calling thread
    (what `ferry.engine(d).stats()["crew_threads"]` reports). A GPU's engine
    uses its NUMA node's crew on a host with several online nodes (the node's
    CPUs this thread may use), else the default crew (every usable CPU);
  - profile path (src/copy/profile_file.cpp, profile_file_path): FERRY_PROFILE
    names the file, else $XDG_CACHE_HOME/ferry/profile.txt, else
    $HOME/.cache/ferry/profile.txt, else none. `ferry bench copy --calibrate`
    writes the profile to profile_path() too: one rule in Python.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from typing import Iterable, Mapping

from . import parsers
from .host import read_text

SYS_NODES_ONLINE = "/sys/devices/system/node/online"
SYS_NODES = "/sys/devices/system/node"
DEFAULT_THREAD_CAP = 16  # kDefaultThreadCap (src/core/thread_counts.h)
MAX_WORKERS = 1024  # FERRY_COPY_WORKERS' range is 0 .. 1024 (src/core/options.cpp)
_C_SPACE = " \t\n\v\f\r"  # what the engine's option parser trims (isspace)
_INTEGER = re.compile(r"[+-]?[0-9]+")


# --- the machine profile ------------------------------------------------------------


def profile_path(environ: Mapping[str, str] | None = None) -> tuple[str | None, bool]:
    """(path, named): the machine profile file the copy engine reads, and whether
    FERRY_PROFILE named it; (None, False) when none of the variables is set."""
    env = os.environ if environ is None else environ
    named = (env.get("FERRY_PROFILE") or "").strip(_C_SPACE)
    if named:
        return named, True
    cache, home = env.get("XDG_CACHE_HOME"), env.get("HOME")
    if cache:
        return cache + "/ferry/profile.txt", False
    if home:
        return home + "/.cache/ferry/profile.txt", False
    return None, False


def profile_present(path: str | None) -> bool | None:
    """True when `path` is a regular file, False when nothing is there (the engine
    then uses its built-in defaults), None when it cannot tell or something else is
    there (the engine refuses a directory, a FIFO or an unreadable file)."""
    if path is None:
        return False
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        return False if exc.errno in (errno.ENOENT, errno.ENOTDIR) else None
    return True if stat.S_ISREG(mode) else None


# --- the crew of copy threads -----------------------------------------------------------


def workers_option(text: str | None) -> int | None:
    """FERRY_COPY_WORKERS as the engine parses it: 0 when unset, the integer when it
    is one in 0 .. 1024, None for anything else (the engine refuses to start)."""
    if text is None:
        return 0
    value = text.strip(_C_SPACE)
    if not _INTEGER.fullmatch(value):
        return None
    n = int(value)
    return n if 0 <= n <= MAX_WORKERS else None


def crew_size(workers: int, numa_node: int | None, online_nodes: Iterable[int], node_cpus: Iterable[int],
              usable_cpus: Iterable[int]) -> tuple[int, int | None]:
    """(threads, node): the size of the crew that serves a GPU on NUMA node `numa_node`
    (None: none known) and the node the crew is bound to (None: the default crew).

    `workers` is FERRY_COPY_WORKERS (0: one per CPU); the rest are the host's facts:
    its online nodes, that node's CPUs and the CPUs this thread may use."""
    online, usable = set(online_nodes), set(usable_cpus)
    bound = set(node_cpus) & usable if numa_node is not None and len(online) > 1 and numa_node in online else set()
    home = numa_node if bound else None
    if workers > 0:
        return workers, home
    return max(1, min(len(bound) if bound else len(usable), DEFAULT_THREAD_CAP)), home


def usable_cpus() -> list[int]:
    """The CPUs this thread may run on (sched_getaffinity); every online CPU when
    that cannot be read."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def collect_copy_engine(gpus: list[dict], notes: list[str], environ: Mapping[str, str] | None = None) -> dict:
    """{"workers_option", "crew_threads", "crew_numa_node", "profile": {"path",
    "named", "present"}} for this process (facts/__init__.py describes them)."""
    env = os.environ if environ is None else environ
    raw = env.get("FERRY_COPY_WORKERS")
    workers = workers_option(raw)
    path, named = profile_path(env)
    out = {"workers_option": workers, "crew_threads": None, "crew_numa_node": None,
           "profile": {"path": path, "named": named, "present": profile_present(path)}}
    if workers is None:
        notes.append(f"FERRY_COPY_WORKERS={raw!r} is not an integer 0 .. {MAX_WORKERS}: "
                     "the copy engine refuses it, crew size unknown")
        return out
    online = parsers.parse_cpulist(read_text(SYS_NODES_ONLINE)) or []
    usable = usable_cpus()
    nodes = {_gpu_node(g) for g in gpus} or {None}  # no GPU: the default crew
    crews = [crew_size(workers, node, online, [] if node is None else _node_cpus(node), usable)
             for node in sorted(nodes, key=lambda n: -1 if n is None else n)]
    out["crew_threads"], out["crew_numa_node"] = min(crews, key=lambda c: c[0])
    return out


def _gpu_node(gpu: object) -> int | None:
    node = gpu.get("numa_node") if isinstance(gpu, dict) else None
    return node if isinstance(node, int) and not isinstance(node, bool) and node >= 0 else None


def _node_cpus(node: int) -> list[int]:
    return parsers.parse_cpulist(read_text(f"{SYS_NODES}/node{node}/cpulist")) or []
