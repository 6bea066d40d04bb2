"""The copy engine's settings on this host: how many threads its crew of copy
threads has, and which machine profile file it reads (if any). Neither needs CUDA.

Both are the engine's own decisions, asked through the native module (its no-CUDA
functions, passed in by the caller: this package imports nothing of ferry), not
restated here:
  - crew size: _ferry.plan_copy_crew(node) (src/copy/copy_crew.h, plan_copy_crew,
    which copy_crew() makes its crews by): FERRY_COPY_WORKERS threads when set
    above 0, else one per CPU the crew may use, at most 16, counting the calling
    thread (what `ferry.engine(d).stats()["crew_threads"]` reports). A GPU's engine
    uses its NUMA node's crew on a host with several online nodes (the node's CPUs
    this thread may use), else the default crew (every usable CPU);
  - profile path: _ferry.profile_file_path() (src/copy/profile_file.h): FERRY_PROFILE
    names the file, else $XDG_CACHE_HOME/ferry/profile.txt, else
    $HOME/.cache/ferry/profile.txt, else none. `ferry bench copy --calibrate`
    writes the profile there too.

The engine reads the FERRY_* variables once per process (src/core/options.h), so
the answers are this process's: a FERRY_COPY_WORKERS or FERRY_PROFILE set after the
first read changes nothing (XDG_CACHE_HOME and HOME are read at each call).
"""

from __future__ import annotations

import errno
import os
import stat


# --- the machine profile ------------------------------------------------------------


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


def collect_copy_engine(gpus: list[dict], notes: list[str], engine) -> dict:
    """{"workers_option", "crew_threads", "crew_numa_node", "profile": {"path",
    "named", "present"}} for this process (facts/__init__.py describes them), from
    `engine`: the native module (ferry._ferry) or anything with its
    plan_copy_crew(node) and profile_file_path(); all None, with a note, when the
    engine refuses the FERRY_* variables."""
    try:
        path, named = engine.profile_file_path()
        # The crew of each GPU's node (-1: none known, the default crew; also without GPUs).
        crews = [engine.plan_copy_crew(node) for node in sorted({_gpu_node(g) for g in gpus} or {-1})]
    except ValueError as exc:  # ferry.InvalidArgumentError is one (this package cannot import ferry's)
        notes.append(f"the copy engine refuses this environment ({exc}): crew size and machine profile unknown")
        return {"workers_option": None, "crew_threads": None, "crew_numa_node": None, "profile": None}
    smallest = min(crews, key=lambda c: c["threads"])
    return {"workers_option": smallest["workers"], "crew_threads": smallest["threads"],
            "crew_numa_node": smallest["numa_node"],
            "profile": {"path": path, "named": named, "present": profile_present(path)}}


def _gpu_node(gpu: object) -> int:
    node = gpu.get("numa_node") if isinstance(gpu, dict) else None
    return node if isinstance(node, int) and not isinstance(node, bool) and node >= 0 else -1
