"""`ferry bench load`'s child processes, the parent's side (load_child.py is the
child's, with the protocol): start them, wait until each says it is ready,
release them all at once (one "go" line to each, back to back: the barrier),
collect one result from each per round. Every wait is bounded: a child that
fails, hangs or dies is reported with why (its error, or its last stderr line
and exit status), killed if it does not end, and never waited for without end.
"""

from __future__ import annotations

import collections
import json
import os
import queue
import subprocess
import sys
import threading
import time

from .load_child import GO, MARK

CHILD_TIMEOUT_S = 300.0  # ready (imports, CUDA, a warm-up load) and each result
FINISH_S = 10.0  # a child's exit after its last result or after stdin closes


class ChildFailed(Exception):
    """A child did not do what the protocol says; the message says what it did."""


def child_env() -> dict:
    """The environment of a child: this one, with the directory that holds the
    ferry package first on PYTHONPATH (the child imports the same ferry)."""
    env = dict(os.environ)
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = here + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    return env


class Child:
    """One child process: its messages on a queue (a thread reads its stdout),
    the tail of its stderr (another thread)."""

    def __init__(self, job: dict):
        self.job = job
        self.proc = subprocess.Popen([sys.executable, "-m", "ferry.bench.load_child", json.dumps(job)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=child_env())
        self.messages: queue.Queue = queue.Queue()
        self.stderr: collections.deque = collections.deque(maxlen=20)
        self.other: collections.deque = collections.deque(maxlen=20)  # stdout lines that are not messages
        self._threads = [threading.Thread(target=self._read_stdout, daemon=True),
                         threading.Thread(target=self._read_stderr, daemon=True)]
        for t in self._threads:
            t.start()

    def _read_stdout(self) -> None:
        for line in self.proc.stdout:
            if not line.startswith(MARK):
                self.other.append(line.rstrip())
                continue
            try:
                self.messages.put(json.loads(line[len(MARK):]))
            except ValueError:
                self.messages.put({"event": "error", "error": f"an unreadable message: {line.strip()[:200]!r}"})
        self.messages.put(None)  # end of its stdout: it exited (or closed it)

    def _read_stderr(self) -> None:
        for line in self.proc.stderr:
            if line.strip():
                self.stderr.append(line.rstrip())

    def expect(self, event: str, deadline: float) -> dict:
        """The child's next message, which must be `event` and arrive before
        `deadline` (time.monotonic()); else ChildFailed saying what happened."""
        try:
            msg = self.messages.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise ChildFailed(f"no {event!r} within {self.job.get('timeout', CHILD_TIMEOUT_S):g} s") from None
        if msg is None:
            try:
                rc = self.proc.wait(FINISH_S)
            except subprocess.TimeoutExpired:
                rc = "still running"
            last = self.stderr[-1] if self.stderr else "nothing on stderr"
            raise ChildFailed(f"ended (exit status {rc}) before {event!r}: {last}")
        if msg.get("event") == "error":
            raise ChildFailed(msg.get("error", "an error without a message"))
        if msg.get("event") != event:
            raise ChildFailed(f"sent {msg.get('event')!r} where {event!r} was due")
        return msg

    def go(self) -> None:
        try:
            self.proc.stdin.write(GO + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as e:
            raise ChildFailed(f"could not be released ({type(e).__name__}: {e})") from None

    def finish(self) -> int:
        """Closes its stdin (a child waiting for "go" ends), waits FINISH_S, then
        kills it; its exit status (negative: the signal that ended it)."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass  # it is gone already
        try:
            return self.proc.wait(FINISH_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(FINISH_S)
        finally:
            for t in self._threads:
                t.join(FINISH_S)


def run_together(jobs: list[dict], rounds: int = 1, timeout: float = CHILD_TIMEOUT_S) -> list[dict]:
    """Starts one child per job, waits until all are ready, then `rounds` times
    releases them all at once and collects a result from each. Per child:
    {job, ready, results: [one per round], error: None or why, exit_status}.
    When one child fails, the others are not released again (their error says
    which one failed); every child has ended when this returns."""
    jobs = [{**j, "timeout": timeout} for j in jobs]
    out = [{"job": j, "ready": None, "results": [], "error": None, "exit_status": None} for j in jobs]
    children: list[Child] = []
    try:
        for j in jobs:
            children.append(Child(j))
        if _all(children, out, "ready", timeout):
            for _ in range(rounds):
                if not _release(children, out) or not _all(children, out, "result", timeout):
                    break
    finally:
        for k, c in enumerate(children):
            out[k]["exit_status"] = c.finish()
            if out[k]["exit_status"] != 0 and out[k]["error"] is None:
                _fail(out, k, f"exit status {out[k]['exit_status']}: "
                              f"{c.stderr[-1] if c.stderr else 'nothing on stderr'}")
            out[k]["stderr_tail"] = list(c.stderr)[-5:]
    return out


def _all(children: list[Child], out: list[dict], event: str, timeout: float) -> bool:
    """Every child's next `event`, within `timeout` of now; False (the failures
    recorded) when one did not come."""
    deadline = time.monotonic() + timeout
    ok = True
    for k, c in enumerate(children):
        try:
            msg = c.expect(event, deadline)
        except ChildFailed as e:
            _fail(out, k, str(e))
            ok = False
            continue
        if event == "ready":
            out[k]["ready"] = msg
        else:
            out[k]["results"].append(msg)
    if not ok:
        who = [f"child {k}" for k, o in enumerate(out) if o["error"]]
        for o in out:
            if o["error"] is None:
                o["error"] = f"stopped: {', '.join(who)} failed"
    return ok


def _release(children: list[Child], out: list[dict]) -> bool:
    """The barrier: one "go" per child, back to back. False when one could not
    be released (it died); the ones released then finish their step."""
    ok = True
    for k, c in enumerate(children):
        try:
            c.go()
        except ChildFailed as e:
            _fail(out, k, str(e))
            ok = False
    return ok


def _fail(out: list[dict], k: int, why: str) -> None:
    if out[k]["error"] is None:
        out[k]["error"] = why
