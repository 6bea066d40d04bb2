"""Rank processes for the node tests: one spawned process per rank, each
answering the test through a pipe (test_node_load.py, test_node_plan.py)."""

from __future__ import annotations

import multiprocessing as mp


def spawn(target, args_per_rank, wait: float = 120) -> list:
    """Runs target(*args, conn) in one spawned process per args; their replies, in order."""
    ctx = mp.get_context("spawn")
    procs = []
    for args in args_per_rank:
        parent, child = ctx.Pipe()
        p = ctx.Process(target=target, args=(*args, child))
        p.start()
        procs.append((p, parent))
    outs = []
    for p, parent in procs:
        assert parent.poll(wait), "a rank did not answer"
        outs.append(parent.recv())
        p.join(30)
    return outs
