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

import re

from ..bounded_read import Unreadable, read_regular_file


# --- the machine profile ------------------------------------------------------------

# The engine reads at most this much of a profile (src/copy/profile_file.cpp,
# kMaxProfileBytes): a bigger file is refused, not read.
PROFILE_MAX_BYTES = 64 << 10
_PROFILE_KEY = re.compile(r"[a-z][a-z0-9_]*")  # the form of every key the engine knows


def profile_state(path: str | None) -> dict:
    """{"present", "problem"} of the profile file at `path`: present True for a file
    the engine can read as a profile, False for nothing there (the built-in
    defaults, or a refusal where FERRY_PROFILE named it), None for something the
    engine refuses to use, with `problem` saying why: not a regular file, unreadable,
    over PROFILE_MAX_BYTES, or a line that is not `key = value` (the engine's words,
    src/copy/profile_file.cpp and strategy.cpp; a line is never quoted: the file may
    be anyone's). Which keys and values are allowed is the engine's to say when it
    first copies (ferry.engine(d) names the line); this catches a file that is no
    profile at all (FERRY_PROFILE=/etc/passwd, a binary, a stray JSON)."""
    if path is None:
        return {"present": False, "problem": None}
    try:
        text = read_regular_file(path, PROFILE_MAX_BYTES)
    except Unreadable as e:
        if e.missing:
            return {"present": False, "problem": None}
        if e.reason.startswith("a directory"):
            return {"present": None, "problem": "a directory, not a profile"}
        if "regular file" in e.reason:
            return {"present": None, "problem": "not a regular file"}
        if "more than" in e.reason:
            return {"present": None, "problem": f"larger than {PROFILE_MAX_BYTES >> 10} KiB, not a profile"}
        return {"present": None, "problem": f"the profile: {e.reason}"}
    problem = _profile_form_problem(text.decode("latin-1"))
    return {"present": True if problem is None else None, "problem": problem}


def _profile_form_problem(text: str) -> str | None:
    """The first line that is not blank, a `#` comment or `key = value`, or None."""
    for number, line in enumerate(text.split("\n"), 1):
        line = line.split("#", 1)[0]
        if not line.strip(" \t\r"):
            continue
        if "=" not in line:
            return f"profile line {number}: expected key = value (is this a ferry profile?)"
        if not _PROFILE_KEY.fullmatch(line.split("=", 1)[0].strip(" \t\r")):
            return f"profile line {number}: not a profile key (is this a ferry profile?)"
    return None


# --- the crew of copy threads -----------------------------------------------------------


def collect_copy_engine(gpus: list[dict], notes: list[str], engine) -> dict:
    """{"workers_option", "crew_threads", "crew_numa_node", "profile": {"path",
    "named", "present", "problem"}} for this process (facts/__init__.py describes them), from
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
            "profile": {"path": path, "named": named, **profile_state(path)}}


def _gpu_node(gpu: object) -> int:
    node = gpu.get("numa_node") if isinstance(gpu, dict) else None
    return node if isinstance(node, int) and not isinstance(node, bool) and node >= 0 else -1
