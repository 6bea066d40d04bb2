"""ferry._per_device: one object per key, made once even when threads ask at
once, forgotten in a forked child (also with its lock held by another thread
at the fork), by the one fork handler every cache shares."""

import os
import random
import threading

from ferry._per_device import PerDevice


def test_one_object_per_key_when_threads_ask_at_once():
    made = []
    gate = threading.Barrier(8)

    def make(key):
        made.append(key)
        return object()

    cache = PerDevice(make)
    keys = [random.randrange(3) for _ in range(8)]
    got = [None] * 8

    def ask(i):
        gate.wait()
        got[i] = cache.get(keys[i])

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(made) == sorted(set(keys)), made
    for k, obj in zip(keys, got):
        assert obj is cache.peek(k)
    cache.clear()
    assert all(cache.peek(k) is None for k in keys)
    assert cache.get(keys[0]) is not got[0]  # made anew after clear()


def test_every_cache_is_forgotten_in_a_forked_child_even_mid_lock():
    caches = [PerDevice(lambda key: [key]) for _ in range(3)]
    for i, c in enumerate(caches):
        c.get(i)
        c.get(None)
    held, release = threading.Event(), threading.Event()

    def hold():
        with caches[0]._lock, caches[2]._lock:
            held.set()
            release.wait(timeout=60)

    t = threading.Thread(target=hold)
    t.start()
    assert held.wait(timeout=30)
    pid = os.fork()
    if pid == 0:
        ok = all(c.peek(None) is None for c in caches)
        ok = ok and all(c._lock.acquire(timeout=5) and (c._lock.release() or True) for c in caches)
        ok = ok and caches[0].get(7) == [7] and caches[0].peek(7) is not None
        os._exit(0 if ok else 3)
    _, status = os.waitpid(pid, 0)
    release.set()
    t.join(timeout=30)
    assert os.waitstatus_to_exitcode(status) == 0
    assert [c.peek(i) for i, c in enumerate(caches)] == [[0], [1], [2]], "the parent's were dropped"
