"""A child process of `ferry bench load` (--first-loads, --ranks): a fresh
Python that loads the checkpoint and says how long it took.

    python -m ferry.bench.load_child '{"mode": "first", "method": "ferry", "paths": [...], "device": 0, ...}'

The protocol (load_procs.py is the parent's side): every message to the parent
is one line on stdout, MARK then a JSON object whose "event" is "ready" (set up:
imports and CUDA done, nothing timed yet; "ready_at" and every "_start" and
"_end" are CLOCK_MONOTONIC, one clock for the host's processes), "result" (one
timed step) or "error" (then the exit status is 1). Other stdout lines (a library's own prints) are
not messages. The parent answers on stdin: a line "go" starts one timed step
(the barrier: the parent writes it to every child at once); end of input ends
the child. Each wait for "go" is bounded by the job's "timeout" (seconds).

Modes: "first": after "ready", one "go" times the process's first load (and,
for ferry, the creation of the default loader with its pinned staging first,
through ferry.load.default_loader), its second, and one after
torch.cuda.empty_cache(); "rank": one untimed load before "ready", then one
timed load per "go". Methods: "ferry" (ferry.torch.load_safetensors),
"InstantTensor MMAP" and "safetensors CPU" (safetensors' load_file to the CPU:
no CUDA at all, the path the CPU tests drive). Every load is compared bit for
bit with safetensors' own CPU read of the files (tensor by tensor).
"""

from __future__ import annotations

import json
import os
import queue
import sys
import threading
import time

from ..errors import InvalidArgumentError
from .load_measures import tensor_differs

MARK = "ferry-bench-load-child "  # a message line starts with this
GO = "go"
METHODS = ("ferry", "InstantTensor MMAP", "safetensors CPU")


class Stop(Exception):
    """The parent did not say "go" in time, or went away."""


class Commands:
    """The parent's lines on stdin, read by a thread so that each wait is bounded."""

    def __init__(self, stream, timeout: float):
        self.timeout = timeout
        self._lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream) -> None:
        for line in stream:
            self._lines.put(line.strip())
        self._lines.put(None)  # end of input

    def wait_go(self) -> None:
        try:
            line = self._lines.get(timeout=self.timeout)
        except queue.Empty:
            raise Stop(f"no {GO!r} from the parent within {self.timeout:g} s") from None
        if line is None:
            raise Stop("the parent closed stdin before saying go")
        if line != GO:
            raise Stop(f"unexpected command {line!r} (expected {GO!r})")


def send(event: str, body: dict | None = None, stream=None) -> None:
    print(MARK + json.dumps({"event": event, **(body or {})}), file=stream or sys.stdout, flush=True)


# ---- loading ------------------------------------------------------------------------

class Job:
    """The job's method, ready to time: load() -> {name: tensor}."""

    def __init__(self, job: dict):
        t0 = time.perf_counter()
        import torch

        self.torch, self.job, self.paths = torch, job, list(job["paths"])
        self.method, self.index = job["method"], int(job.get("device", 0))
        if self.method not in METHODS:
            raise InvalidArgumentError(f"method {self.method!r}: expected one of {', '.join(METHODS)}")
        self.cuda = self.method != "safetensors CPU"
        self.facts = {"pid": os.getpid(), "method": self.method, "device": self.index if self.cuda else "cpu"}
        import ferry.torch  # noqa: F401 - imported before timing, as a user's process has it

        self.facts["import_s"] = time.perf_counter() - t0
        if self.cuda:  # the CUDA context exists before any timing
            t0 = time.perf_counter()
            torch.cuda.init()
            torch.cuda.set_device(self.index)
            torch.empty(1, device=f"cuda:{self.index}")
            torch.cuda.synchronize(self.index)
            self.facts["cuda_init_s"] = time.perf_counter() - t0
        self.loader = None  # ferry's: the default one ("first"), or its own ("rank", made by make_loader)

    def make_loader(self, default: bool) -> float:
        """ferry's Loader (pinned staging, reader threads); the seconds it took."""
        from ..load import Loader, default_loader

        t0 = time.perf_counter()
        if default:
            self.loader = default_loader(self.index)
        else:
            self.loader = Loader(self.index, staging_bytes=self.job.get("staging_bytes"),
                                 threads=self.job.get("threads") or None)
        return time.perf_counter() - t0

    def load(self) -> dict:
        if self.method == "ferry":
            from ..torch import load_safetensors

            return load_safetensors(self.paths, device=self.index, loader=self.loader)
        if self.method == "InstantTensor MMAP":
            from instanttensor import Backend, safe_open

            with safe_open(self.paths, framework="pt", device=self.index, backend=Backend.MMAP) as f:
                return dict(f.tensors())
        from safetensors.torch import load_file

        out = {}
        for p in self.paths:
            out.update(load_file(p))
        return out

    def timed(self) -> tuple[float, dict, float, float]:
        """(seconds, tensors, start, end): one load, its copies finished; start
        and end on CLOCK_MONOTONIC, one clock for every process of the host."""
        if self.cuda:
            self.torch.cuda.synchronize(self.index)
        start = time.monotonic()
        t0 = time.perf_counter()
        got = self.load()
        if self.cuda:
            self.torch.cuda.synchronize(self.index)
        seconds = time.perf_counter() - t0
        return seconds, got, start, time.monotonic()


def differs(torch, got: dict, paths: list[str]) -> str | None:
    """None when `got` holds exactly the files' tensors, bit for bit (safetensors'
    CPU read, one tensor at a time), else the first difference."""
    from safetensors import safe_open

    seen = set()
    for p in paths:
        with safe_open(p, framework="pt") as f:
            for k in f.keys():
                seen.add(k)
                if k not in got:
                    return f"{k}: missing"
                why = tensor_differs(torch, k, got[k], f.get_tensor(k))
                if why:
                    return why
    extra = sorted(set(got) - seen)
    return f"extra tensors {extra[:3]}" if extra else None


# ---- the two modes ------------------------------------------------------------------

def _step(j: Job, name: str, out: dict) -> None:
    """One timed load into out[name + "_s"], checked; its tensors freed before the next."""
    seconds, got, start, end = j.timed()
    out[name + "_s"], out[name + "_start"], out[name + "_end"] = seconds, start, end
    bad = differs(j.torch, got, j.paths)
    out[name + "_verified"] = bad is None
    if bad:
        out.setdefault("mismatch", f"{name} load: {bad}")
    del got


def first_loads(j: Job) -> dict:
    """The first load of this process (ferry: the default loader made first,
    timed apart), the second, and one after the allocator's cache is emptied."""
    out = {}
    if j.method == "ferry":
        out["loader_s"] = j.make_loader(default=True)
    _step(j, "first", out)
    _step(j, "second", out)
    if j.cuda:
        j.torch.cuda.empty_cache()  # the next load allocates its device memory again
        _step(j, "after_empty_cache", out)
    return out


def run(job: dict, commands: Commands, stream=None) -> None:
    """The child's whole life after its arguments: set up, "ready", the timed steps."""
    j = Job(job)
    if job["mode"] == "first":
        send("ready", {**j.facts, "ready_at": time.monotonic()}, stream)
        commands.wait_go()
        send("result", first_loads(j), stream)
        return
    if job["mode"] != "rank":
        raise InvalidArgumentError(f"mode {job['mode']!r}: expected 'first' or 'rank'")
    if j.method == "ferry":
        j.facts["loader_s"] = j.make_loader(default=False)
    warm = {}
    _step(j, "warm_up", warm)  # untimed for the figures: allocator, loader, page cache
    send("ready", {**j.facts, **warm, "ready_at": time.monotonic()}, stream)
    for k in range(int(job.get("rounds", 1))):
        commands.wait_go()
        out = {"round": k}
        _step(j, "load", out)
        send("result", out, stream)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        job = json.loads(argv[0])
        run(job, Commands(sys.stdin, float(job.get("timeout", 300))))
        return 0
    except BaseException as e:  # noqa: BLE001 - every failure is told to the parent, then the exit status
        send("error", {"error": f"{type(e).__name__}: {e}"})
        return 1


if __name__ == "__main__":
    sys.exit(main())
