"""ferry.node.Handoff between two processes on GPUs, both routes: through the
node pool's pinned slots (route="pool") and GPU to GPU through the consumer's
device ring (route="peer": CUDA IPC; the same GPU, or two GPUs with peer
access). Random sizes at shuffled places from a printed seed, destinations and
the gaps between them poisoned, every byte checked; a mixed run whose first
slots go through the pool before the consumer joins and the rest GPU to GPU;
host destinations (an offload tier) take the pool under route="auto".

Each case skips with its reason where the machine cannot run it (no CUDA
device; the two-GPU cases: fewer than 2 GPUs, or no peer access between them).
scripts/gpu-handoff runs this file on the GPU machine."""

from __future__ import annotations

import multiprocessing
import os
import queue
import uuid

import pytest

np = pytest.importorskip("numpy")

from ferry.node import Handoff, NodePool  # noqa: E402

CTX = multiprocessing.get_context("spawn")
POISON = 0xEE
GAP = 512  # bytes between items, poisoned, that must stay untouched


def _name() -> str:
    return f"t-hog-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _seed() -> int:
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"handoff GPU test seed {seed}")
    return seed


def _two_gpus_reaching(gpu) -> tuple[int, int]:
    from ferry import _ferry

    if len(gpu["devices"]) < 2:
        pytest.skip("needs 2 GPUs (this machine has 1): the two-GPU peer route")
    if not _ferry.devices_reach(0, 1):
        pytest.skip("GPU 0 cannot access GPU 1 (no NVLink or PCIe peer access): the peer route cannot run here")
    return 0, 1


def _sizes(seed: int, r: int, big: bool | str) -> list[int]:
    """Round r: KV-like blocks (64 KiB, 2 MiB) and odd sizes, zeros now and then."""
    rng = np.random.default_rng(seed * 31 + r)
    if big == "kv":  # blocks averaging >= 256 KiB (auto sends smaller ones by the pool); a round in 8 MiB
        kinds = [256 << 10, 1 << 20, 300_001]
        return [kinds[k] for k in rng.integers(0, len(kinds), int(rng.integers(2, 7)))]
    if big == "sub1m":  # odd sizes under 1 MiB: every batch goes by the copy kernel where peer_sms > 0
        sizes = [int(x) for x in rng.integers(0, 1 << 20, int(rng.integers(5, 40)))]
        sizes[0] = max(sizes[0], 1)
        return sizes
    kinds = [64 << 10, 2 << 20, 65535, 1, 0] if big else [4096, 65536, 777, 1, 0]
    odd = int(rng.integers(1, 3 << 20 if big else 100_000))
    sizes = [kinds[k] if k < len(kinds) else odd for k in rng.integers(0, len(kinds) + 1, int(rng.integers(5, 40)))]
    sizes[0] = max(sizes[0], 1)  # every round moves something (a slot per round in the mixed run)
    return sizes


def _layout(seed: int, sizes: list[int], salt: int) -> tuple[np.ndarray, int]:
    """Offsets of the items in a buffer, in a seeded shuffled order, GAP bytes apart."""
    order = np.random.default_rng(seed + salt).permutation(len(sizes))
    offsets, at = np.zeros(len(sizes), np.int64), 0
    for i in order.tolist():
        offsets[i] = at
        at += sizes[i] + GAP
    return offsets, at


def _side(role: str, name: str, seed: int, device: int, rounds: int, route: str, opts: dict, q, ctl) -> None:
    """One process: "producer" sends `rounds` rounds; "consumer" receives them into poisoned
    GPU memory (or host memory with opts["host_dsts"]) and checks every byte. opts:
    slots, slot_bytes, big (sizes), hold (producer: after this many rounds, say so on q and
    wait for "go" on ctl), host_dsts, peer_sms (the device ring's copy kernel; 0: copy engines)."""
    try:
        import ferry
        from ferry import _ferry

        _ferry.cuda_warm_up(device)
        pool = NodePool(name, 256 << 20, device=device, label=role)
        h = Handoff(pool, "kv", opts["slots"], opts["slot_bytes"], timeout=60, poll=0.05, route=route,
                    **({"peer_sms": opts["peer_sms"]} if "peer_sms" in opts else {}))
        problems, routes = [], []
        for r in range(rounds):
            if role == "producer" and r == opts.get("hold"):
                q.put(("held", r))
                assert ctl.get(timeout=120) == "go"
            sizes = _sizes(seed, r, opts.get("big", True))
            src_off, src_n = _layout(seed + r, sizes, 1)
            dst_off, dst_n = _layout(seed + r, sizes, 2)
            data = np.random.default_rng(seed + 1000 + r).integers(0, 256, max(src_n, 1), dtype=np.uint8)
            if role == "producer":
                buf = _ferry.cuda_malloc(src_n, device)
                ferry.copy(buf, data, src_n, device=device)
                h.send(src_off + buf, sizes)
                _ferry.cuda_free(buf)
            else:
                host = None
                if opts.get("host_dsts"):
                    host = np.full(dst_n, POISON, np.uint8)
                    base = host.ctypes.data
                else:
                    base = _ferry.cuda_malloc(dst_n, device)
                    ferry.copy(base, np.full(dst_n, POISON, np.uint8), dst_n, device=device)
                h.recv(dst_off + base, sizes)
                routes.append(h.last_route)
                if host is None:
                    got = np.empty(dst_n, np.uint8)
                    ferry.copy(got, base, dst_n, device=device)
                    _ferry.cuda_free(base)
                else:
                    got = host
                written = np.zeros(dst_n, bool)
                for i, n in enumerate(sizes):
                    d, s = int(dst_off[i]), int(src_off[i])
                    written[d:d + n] = True
                    if not np.array_equal(got[d:d + n], data[s:s + n]):
                        problems.append(f"round {r} item {i} ({n} bytes) differs (seed {seed})")
                if (got[~written] != POISON).any():
                    problems.append(f"round {r}: bytes between the items were written (seed {seed})")
                if r == 0 and opts.get("hold") is not None:
                    q.put(("received", 0))  # the ring is published: the producer may go on
        if role == "producer":
            h.drain()
        stats = h.stats()
        h.close()
        q.put(("ok", {"problems": problems, "stats": stats, "routes": routes}))
    except Exception as e:
        q.put(("error", f"{type(e).__name__}: {e}"))


def _run(devices: tuple[int, int], routes: tuple[str, str], rounds: int, opts: dict, seed: int) -> dict:
    """Producer on devices[0] with routes[0], consumer on devices[1] with routes[1]; both
    results (the consumer's messages first: one side's error is often the other's timeout)."""
    name = _name()
    qs = {role: CTX.Queue() for role in ("producer", "consumer")}
    ctl = CTX.Queue()
    procs = {role: CTX.Process(target=_side, args=(role, name, seed, dev, rounds, route, opts, qs[role], ctl))
             for role, dev, route in zip(("producer", "consumer"), devices, routes)}
    results = {}
    try:
        if opts.get("hold") is not None:  # the producer fills slots before the consumer exists
            procs["producer"].start()
            assert qs["producer"].get(timeout=150) == ("held", opts["hold"])
            procs["consumer"].start()
            kind, value = qs["consumer"].get(timeout=150)
            assert kind == "received", value
            ctl.put("go")
        else:
            for p in procs.values():
                p.start()
        for role in ("consumer", "producer"):
            try:
                results[role] = qs[role].get(timeout=240)
            except queue.Empty:
                results[role] = ("error", f"no answer within 240 s (exit code {procs[role].exitcode}: a crash?)")
    finally:
        for p in procs.values():
            if p.is_alive() or p.exitcode is None:
                p.join(60)
            if p.is_alive():
                p.kill()
    failed = {role: value for role, (kind, value) in results.items() if kind != "ok"}
    assert not failed, f"seed {seed}: {failed}"
    assert results["consumer"][1]["problems"] == [], results["consumer"][1]["problems"]
    return {role: value for role, (_, value) in results.items()}


OPTS = {"slots": 3, "slot_bytes": 8 << 20, "big": True}


@pytest.mark.parametrize("peer_sms,sizes", [(32, "sub1m"), (1, "sub1m"), (0, True), (32, True)])
def test_two_gpus_peer_route_bit_exact(gpu, peer_sms, sizes):
    """GPU 0 -> GPU 1 through the consumer's device ring: every slot GPU to GPU, by the
    SM copy kernel on both sides (peer_sms > 0 and blocks under 1 MiB: 1 SM gives every
    warp many blocks), by the copy engines (0), or both at once (KV sizes up to 3 MiB:
    blocks of 1 MiB and more take the copy engines beside the kernel)."""
    devices, seed = _two_gpus_reaching(gpu), _seed()
    out = _run(devices, ("peer", "auto"), 6, dict(OPTS, peer_sms=peer_sms, big=sizes), seed)
    st = out["consumer"]["stats"]
    assert st["pool_slots"] == 0 and st["peer_slots"] == st["received"] > 0, st
    assert set(out["consumer"]["routes"]) <= {"peer", None}
    for role in ("producer", "consumer"):
        sm = out[role]["stats"]["sm_batches"]
        if peer_sms == 0:
            assert sm == 0, (role, out[role]["stats"])
        elif sizes == "sub1m":
            assert sm == out[role]["stats"]["sent" if role == "producer" else "received"] > 0, (role, out[role])


def test_two_gpus_pool_route_bit_exact(gpu):
    """GPU 0 -> node pool -> GPU 1 with route="pool" on both sides (no device ring)."""
    if len(gpu["devices"]) < 2:
        pytest.skip("needs 2 GPUs (this machine has 1)")
    seed = _seed()
    out = _run((0, 1), ("pool", "pool"), 6, OPTS, seed)
    st = out["consumer"]["stats"]
    assert st["peer_slots"] == 0 and st["pool_slots"] == st["received"] > 0, st


@pytest.mark.parametrize("route", ["peer", "pool"])
def test_one_gpu_both_processes_on_it_bit_exact(gpu, route):
    """Two processes on GPU 0: the device ring of the same GPU (CUDA IPC), or the pool."""
    seed = _seed()
    out = _run((0, 0), (route, "auto"), 5, OPTS, seed)
    st = out["consumer"]["stats"]
    key = "peer_slots" if route == "peer" else "pool_slots"
    assert st[key] == st["received"] > 0, st


def test_a_mixed_run_sends_the_first_slots_by_the_pool_then_gpu_to_gpu(gpu):
    """The producer fills 3 slots before the consumer exists (no device ring yet: the
    pool); the consumer's first recv publishes its ring, and every later slot goes GPU to
    GPU. Each slot is read from where it went."""
    seed = _seed()
    devices = (0, 1) if len(gpu["devices"]) >= 2 and _reach(0, 1) else (0, 0)
    opts = {"slots": 4, "slot_bytes": 8 << 20, "big": "kv", "hold": 3}  # a round fits one slot
    rounds = 12
    out = _run(devices, ("auto", "auto"), rounds, opts, seed)
    st = out["consumer"]["stats"]
    assert st["pool_slots"] == 3 and st["peer_slots"] == rounds - 3, (devices, st)
    assert out["consumer"]["routes"][:3] == ["pool"] * 3 and out["consumer"]["routes"][3:] == ["peer"] * (rounds - 3)


def test_small_blocks_take_the_pool_under_auto_with_copy_engines_only(gpu):
    """With peer_sms=0 (copy engines only), blocks averaging below 256 KiB go through the
    pool under route="auto": GPU to GPU they move one DMA descriptor each, slower than
    through host memory (2x H100: 64 KiB blocks 13.2 GB/s peer, 39.9 pool)."""
    seed = _seed()
    devices = (0, 1) if len(gpu["devices"]) >= 2 and _reach(0, 1) else (0, 0)
    out = _run(devices, ("auto", "auto"), 4, dict(OPTS, big=False, peer_sms=0), seed)
    st = out["consumer"]["stats"]
    assert st["peer_slots"] == 0 and st["pool_slots"] == st["received"] > 0, st


def test_small_blocks_go_gpu_to_gpu_by_the_copy_kernel_under_auto(gpu):
    """With the copy kernel (the default peer_sms), small and odd blocks (1 byte to
    100 KB, zeros among them) go GPU to GPU under route="auto", bit-exact."""
    seed = _seed()
    devices = (0, 1) if len(gpu["devices"]) >= 2 and _reach(0, 1) else (0, 0)
    out = _run(devices, ("auto", "auto"), 6, dict(OPTS, big=False), seed)
    st, prod = out["consumer"]["stats"], out["producer"]["stats"]
    # slots sent before the consumer's first recv published its ring take the pool
    # (at most `slots` of them); every later one goes GPU to GPU
    assert st["peer_slots"] >= st["received"] - OPTS["slots"] and st["peer_slots"] > 0, st
    assert "average" not in (prod.get("route_note") or ""), prod
    assert st["sm_batches"] > 0 and prod["sm_batches"] > 0, out


def test_host_destinations_take_the_pool_under_auto(gpu):
    """A consumer that receives into host memory (an offload tier) publishes no device
    ring: route="auto" sends through the pool."""
    seed = _seed()
    devices = (0, 1) if len(gpu["devices"]) >= 2 else (0, 0)
    out = _run(devices, ("auto", "auto"), 4, dict(OPTS, host_dsts=True), seed)
    st = out["consumer"]["stats"]
    assert st["peer_slots"] == 0 and st["pool_slots"] == st["received"] > 0, st


def _reach(a: int, b: int) -> bool:
    from ferry import _ferry

    return _ferry.devices_reach(a, b)
