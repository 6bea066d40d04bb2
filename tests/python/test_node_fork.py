"""A forked child of a NodePool member (issue 38 item 9): every use of the parent's
NodePool, its NodeBlocks and its Handoffs raises ferry's NotSupportedError, whose
message is about the node pool and says what to do (open it again by name); none
ends in SIGSEGV (the pool's mapping is hidden from children: a touch would fault).
The child then does what the message says, NodePool(name), and reads the parent's
block. It exits through sys.exit(0), so the interpreter's exit runs ~NodePool of the
parent's objects in the child.

A fresh interpreter runs each case (python -c), so that the child's sys.exit leaves
that interpreter, not pytest; the child writes one line per access to a pipe as it
goes, so an access that kills it still shows which one.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pytest

if not hasattr(os, "fork"):
    pytest.skip("no fork", allow_module_level=True)

_CASE = r'''
import json, os, sys
from ferry.node import Handoff, NodePool, memmove_many

name = sys.argv[1]
pool = NodePool(name, 1 << 20, label="parent")
block = pool.alloc(4096)
block.view()[:5] = b"hello"
named = pool.named("n", 4096)
h = Handoff(pool, "h", 2, 4096, timeout=5, copy=memmove_many)
used = pool.stats()["used"]
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(r)
    out = os.fdopen(w, "w", buffering=1)
    accesses = [
        ("pool.address", lambda: pool.address),
        ("block.address", lambda: block.address),
        ("block.view()", lambda: bytes(block.view()[:5])),
        ("named.view()", lambda: bytes(named.view()[:5])),
        ("pool.name", lambda: pool.name),
        ("pool.capacity", lambda: pool.capacity),
        ("pool.stats()", lambda: pool.stats()),
        ("pool.holders()", lambda: pool.holders()),
        ("pool.alloc(1)", lambda: pool.alloc(1)),
        ("pool.named()", lambda: pool.named("m", 4096)),
        ("pool.block()", lambda: pool.block(block.handle)),
        ("pool.free()", lambda: pool.free(block)),
        ("pool.take()", lambda: pool.take(block)),
        ("pool.add()", lambda: pool.add(block, 0)),
        ("pool.value()", lambda: pool.value(block, 0)),
        ("pool.wait()", lambda: pool.wait(block, 0, 0, timeout=0)),
        ("pool.ready()", lambda: pool.ready(block)),
        ("pool.wait_ready()", lambda: pool.wait_ready(block)),
        ("pool.reclaim_dead()", lambda: pool.reclaim_dead()),
        ("h.send()", lambda: h.send([bytearray(10)], None)),
        ("h.recv()", lambda: h.recv([bytearray(10)], None)),
        ("h.drain()", lambda: h.drain(timeout=1)),
        ("h.pending", lambda: h.pending),
        ("Handoff()", lambda: Handoff(pool, "h2", 2, 4096, copy=memmove_many)),
    ]
    for what, call in accesses:
        out.write(json.dumps({"access": what}) + "\n")
        try:
            call()
            got = ["no error", ""]
        except BaseException as e:
            got = [type(e).__name__, str(e)]
        out.write(json.dumps({"access": what, "got": got}) + "\n")
    out.write(json.dumps({"repr": repr(pool)}) + "\n")
    h.close()  # drops the child's copy, frees nothing of the parent's
    again = NodePool(name, label="child")  # what the message says: attaches, the parent serves
    out.write(json.dumps({"again": bytes(again.block(block.handle).view()[:5]).decode()}) + "\n")
    again.close()
    out.write(json.dumps({"exit": True}) + "\n")
    sys.exit(0)
os.close(w)
with os.fdopen(r) as f:
    lines = f.read()
_, status = os.waitpid(pid, 0)
print(json.dumps({"lines": lines, "status": status, "used": [used, pool.stats()["used"]],
                  "parent_block": bytes(block.view()[:5]).decode(), "h_open": h.block is not None}))
h.close()
pool.close()
'''


def test_every_use_of_a_parents_pool_in_a_forked_child_is_a_clear_refusal():
    name = f"fk{os.getpid()}-{random.randrange(1 << 30)}"
    env = {**os.environ, "PYTHONFAULTHANDLER": ""}
    r = subprocess.run([sys.executable, "-c", _CASE, name], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(r.stdout.strip().splitlines()[-1])
    lines = [json.loads(line) for line in result["lines"].splitlines()]
    tried = [x for x in lines if "got" in x]
    started = [x["access"] for x in lines if "access" in x and "got" not in x]
    assert len(tried) == len(started), f"the child died in {started[len(tried)]}: status {result['status']}, " \
                                       f"stderr {r.stderr[-2000:]}"
    for x in tried:
        kind, message = x["got"]
        assert kind == "NotSupportedError", x
        assert f"NodePool {name!r} was opened in process" in message and "forked child" in message, x
        assert f"NodePool({name!r})" in message and "SIGSEGV" not in message, x
        assert "pinned" not in message, x  # about the node pool, not pinned memory
    assert next(x["repr"] for x in lines if "repr" in x).startswith(f"<NodePool {name!r} of process")
    assert next(x["again"] for x in lines if "again" in x) == "hello"  # reopened by name in the child: it works
    assert {"exit": True} in lines
    # the child's exit status: sys.exit(0) runs ~NodePool of the parent's objects in the child
    status = result["status"]
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, (
        f"the child ended with status {status}"
        + (f" (signal {os.WTERMSIG(status)})" if os.WIFSIGNALED(status) else "") + f": {r.stderr[-2000:]}")
    # the parent's pool is as it was: its block, the named block and the handoff's block are still held
    assert result["parent_block"] == "hello" and result["h_open"]
    assert result["used"][0] == result["used"][1] > 0
