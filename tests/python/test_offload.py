"""ferry.torch.offload_activations (issue 31): a training step under it gives the same
loss and gradients, bit for bit, as without it, while the saved activations wait in
ferry pinned memory; budgets are kept; host memory does not grow over steps; an
exception mid-step leaves no pinned memory held. CPU cases check that the context is
a no-op there and that bad arguments are refused; the rest need a CUDA device."""

import gc
import importlib
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

import ferry  # noqa: E402
import ferry.torch as ft  # noqa: E402

offload_module = importlib.import_module("ferry.torch.offload")

MiB = 1 << 20


class InplaceMLP(torch.nn.Module):
    """In-place ops, views (transpose, reshape, narrow), a residual and a norm."""

    def __init__(self, d=256, hidden=1024):
        super().__init__()
        self.up = torch.nn.Linear(d, hidden)
        self.down = torch.nn.Linear(hidden, d)
        self.norm = torch.nn.LayerNorm(d)
        self.mix = torch.nn.Parameter(torch.randn(d, d) / d ** 0.5)

    def forward(self, x):
        h = self.up(x)
        h.relu_()  # in place: relu saves its output
        h = h * torch.sigmoid(h)
        t = h.transpose(-1, -2)  # a view
        h = (t.transpose(-1, -2) * 1.5).reshape(x.shape[0], -1, h.shape[-1])
        y = self.down(h)
        y = y + x  # residual
        y = self.norm(y)
        z = y @ self.mix.t()  # a view of a parameter
        return z.narrow(-1, 0, z.shape[-1] // 2).pow(2).mean()


def step(model, x, offload=None, amp=False, checkpoint=False):
    for p in model.parameters():
        p.grad = None

    def run():
        with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=amp):
            if checkpoint:  # a checkpointed region saves nothing; the plain half offloads
                return model(x) + torch.utils.checkpoint.checkpoint(model, x * 1.0, use_reentrant=False)
            return model(x)

    if offload is None:
        loss = run()
        loss.backward()
    else:
        with offload:
            loss = run()
            loss.backward()
    return loss.detach().clone(), [p.grad.clone() for p in model.parameters()]


def assert_bit_equal(a, b):
    (loss_a, grads_a), (loss_b, grads_b) = a, b
    assert torch.equal(loss_a, loss_b), (loss_a, loss_b)
    for i, (ga, gb) in enumerate(zip(grads_a, grads_b)):
        assert torch.equal(ga, gb), f"gradient {i} differs: max diff {(ga - gb).abs().max()}"


def test_cpu_step_is_unchanged_and_nothing_is_offloaded():
    torch.manual_seed(0)
    model = InplaceMLP(32, 64)
    x = torch.randn(4, 8, 32)
    plain = step(model, x)
    offload = ft.offload_activations(min_bytes=0)
    assert_bit_equal(plain, step(model, x, offload))
    s = offload.stats
    assert s.offloaded_tensors == 0 and s.kept_tensors > 0 and s.steps == 1


@pytest.mark.parametrize("kwargs, word", [
    ({"max_bytes": -1}, "max_bytes"), ({"max_bytes": True}, "max_bytes"), ({"min_bytes": 1.5}, "min_bytes"),
    ({"max_overhead": "0.1"}, "max_overhead"), ({"max_overhead": -0.5}, "max_overhead"),
    ({"max_bytes": 1 << 30, "max_overhead": 0.1}, "not both"), ({"prefetch_bytes": None}, "prefetch_bytes"),
    ({"target_peak": -1}, "target_peak"), ({"target_peak": 1 << 30, "max_overhead": 0.1}, "not both"),
    ({"target_peak": 1 << 30, "max_bytes": 1 << 30}, "not both"),
])
def test_bad_arguments_are_refused(kwargs, word):
    with pytest.raises(ferry.InvalidArgumentError, match=word):
        ft.offload_activations(**kwargs)


def test_one_step_at_a_time():
    offload = ft.offload_activations()
    with offload:
        with pytest.raises(ferry.InvalidArgumentError, match="already in use"):
            with offload:
                pass


# ---- on a GPU ------------------------------------------------------------------------


def pool_in_use():
    s = ft.default_pinned_pool(0).stats()
    return sum(s[k]["in_use"]["current"] for k in ("small", "huge"))


def pool_reserved():
    s = ft.default_pinned_pool(0).stats()
    return sum(s[k]["reserved"]["current"] for k in ("small", "huge"))


@pytest.fixture
def cuda_model(gpu):
    torch.manual_seed(1)
    model = InplaceMLP().cuda()
    x = torch.randn(16, 256, 256, device="cuda")
    return model, x


@pytest.mark.gpu
@pytest.mark.parametrize("amp, checkpoint", [(False, False), (True, False), (False, True), (True, True)])
def test_gradients_are_bit_equal_to_a_step_without_offload(cuda_model, amp, checkpoint):
    model, x = cuda_model
    plain = step(model, x, amp=amp, checkpoint=checkpoint)
    offload = ft.offload_activations(min_bytes=0)
    for _ in range(2):  # the second step recycles pinned memory of the first
        assert_bit_equal(plain, step(model, x, offload, amp=amp, checkpoint=checkpoint))
    assert offload.stats.offloaded_tensors > 0
    assert offload.stats.last_step_offloaded_bytes > 0


@pytest.mark.gpu
def test_prefetch_and_on_demand_paths_both_bit_equal(cuda_model):
    model, x = cuda_model
    plain = step(model, x)
    for prefetch in (0, 1 << 40):
        offload = ft.offload_activations(min_bytes=0, prefetch_bytes=prefetch)
        assert_bit_equal(plain, step(model, x, offload))
        assert (offload.stats.prefetched > 0) == (prefetch > 0), offload.stats.as_dict()


class Deep(torch.nn.Module):
    """Eight residual MLP blocks: forward's saved activations dominate the peak."""

    def __init__(self, d=256, hidden=1024, blocks=8):
        super().__init__()
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(d, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, d))
            for _ in range(blocks))

    def forward(self, x):
        for block in self.blocks:
            x = x + block(x)
        return x.pow(2).mean()


PEAK = """
    import sys, torch, ferry.torch as ft
    sys.path.insert(0, sys.argv[1])
    from test_offload import Deep, step, assert_bit_equal
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(3)
    model = Deep().cuda()
    x = torch.randn(64, 256, 256, device="cuda")
    plain = step(model, x)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    assert_bit_equal(plain, step(model, x))
    plain_peak = torch.cuda.max_memory_allocated()
    offload = ft.offload_activations(prefetch_bytes=64 << 20)
    step(model, x, offload)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    assert_bit_equal(plain, step(model, x, offload))
    peak = torch.cuda.max_memory_allocated()
    assert peak < plain_peak * 0.7, (peak, plain_peak, offload.stats.as_dict())
    print("peak ok", peak, plain_peak)
"""


@pytest.mark.gpu
def test_peak_gpu_memory_falls(gpu):
    """In a fresh process with cuBLAS made reproducible (CUBLAS_WORKSPACE_CONFIG, as
    PyTorch's reproducibility notes ask). This test found a race: the copy out did not
    wait for the stream that made the tensor (offload._copy_out), and about one run in
    ten gave a first-layer gradient off by 4e-6 on the H200."""
    import os
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(PEAK), os.path.dirname(__file__)],
                       capture_output=True, text=True, timeout=300,
                       env={**os.environ, "CUBLAS_WORKSPACE_CONFIG": ":4096:8"})
    assert r.returncode == 0 and "peak ok" in r.stdout, r.stdout + r.stderr[-3000:]


@pytest.mark.gpu
def test_budget_is_kept_earliest_first(cuda_model):
    model, x = cuda_model
    plain = step(model, x)
    offload = ft.offload_activations(min_bytes=0, max_bytes=20 * MiB)
    assert_bit_equal(plain, step(model, x, offload))
    s = offload.stats
    assert 0 < s.last_step_offloaded_bytes <= 20 * MiB and s.kept_tensors > 0, s.as_dict()


@pytest.mark.gpu
def test_max_overhead_warms_up_times_two_steps_then_offloads(cuda_model):
    model, x = cuda_model
    plain = step(model, x)
    offload = ft.offload_activations(max_overhead=1.0, min_bytes=0)  # a small model: the link is the bound
    for _ in range(offload_module.PLANNING_STEPS):  # warm-up, then timed whole, then by pack: nothing offloaded
        assert_bit_equal(plain, step(model, x, offload))
        assert offload.stats.last_step_offloaded_bytes == 0 and offload.stats.calibration is None
    assert_bit_equal(plain, step(model, x, offload))
    cal = offload.stats.calibration
    assert cal and cal["forward_s"] > 0 and cal["backward_s"] > 0 and cal["eligible_bytes"] > 0, cal
    assert offload.stats.budget_bytes > 0
    assert 0 < offload.stats.last_step_offloaded_bytes <= offload.stats.budget_bytes


@pytest.mark.gpu
def test_max_overhead_follows_its_steps_and_stays_exact_when_it_replans(cuda_model):
    """Each offloaded step is timed (OverheadControl): stats.calibration has the
    measured overhead once a step's events are done, the plan the controller makes
    stays within [0, 2 x asked], and gradients stay bit-equal across plans."""
    model, x = cuda_model
    plain = step(model, x)
    offload = ft.offload_activations(max_overhead=0.05, min_bytes=0)
    for _ in range(offload_module.PLANNING_STEPS + 8):
        assert_bit_equal(plain, step(model, x, offload))
        torch.cuda.synchronize()  # the step's events are done by the next step's start
    cal = offload.stats.calibration
    if offload.stats.budget_bytes == 0 and cal["planned_overhead_s"] == cal["overhead_s"]:
        pytest.skip(f"nothing fits the budget on this GPU: no offloaded step to time ({cal})")
    assert cal["measured_overhead_s"] is not None or cal["planned_overhead_s"] != cal["overhead_s"], cal
    assert 0.0 <= cal["planned_overhead_s"] <= 2 * cal["overhead_s"] + 1e-12, cal


@pytest.mark.gpu
def test_target_peak_plans_the_bytes_it_needs(gpu):
    """target_peak: the timed step's peak less the target is what the plan frees, at
    the overhead stats.calibration reports; the later step's peak comes down."""
    torch.manual_seed(6)
    model = Deep(blocks=8).cuda()
    x = torch.randn(64, 256, 256, device="cuda")
    plain = step(model, x)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    step(model, x)
    plain_peak = torch.cuda.max_memory_allocated()
    target = plain_peak - 300 * MiB  # of about 1.1 GB of activations
    offload = ft.offload_activations(target_peak=target)
    for _ in range(offload_module.PLANNING_STEPS):  # warm-up, then timed
        assert_bit_equal(plain, step(model, x, offload))
    assert_bit_equal(plain, step(model, x, offload))
    cal = offload.stats.calibration
    assert cal["target_peak"] == target and cal["needed_bytes"] > 0 and cal["overhead"] >= 0, cal
    if cal["reached"]:
        assert offload.stats.last_step_offloaded_bytes >= cal["needed_bytes"], (offload.stats.as_dict())
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    assert_bit_equal(plain, step(model, x, offload))
    assert torch.cuda.max_memory_allocated() < plain_peak - 150 * MiB, (torch.cuda.max_memory_allocated(), plain_peak,
                                                                        cal)


@pytest.mark.gpu
def test_host_memory_is_recycled_over_steps(cuda_model):
    model, x = cuda_model
    offload = ft.offload_activations(min_bytes=0)
    step(model, x, offload)
    step(model, x, offload)
    torch.cuda.synchronize()
    reserved = pool_reserved()
    for _ in range(8):
        step(model, x, offload)
    torch.cuda.synchronize()
    assert pool_reserved() == reserved, "host memory grew over steps"


@pytest.mark.gpu
def test_pinned_memory_goes_back_at_step_end_and_close_gives_all_back(cuda_model):
    """Issue 42: between steps the pool holds none of the step's buffers (no reap
    called here: __exit__ does it), and close() trims what the pool cached."""
    model, x = cuda_model
    gc.collect()
    torch.cuda.synchronize()
    before = pool_in_use()
    offload = ft.offload_activations(min_bytes=0)
    for _ in range(3):
        step(model, x, offload)
        assert offload.stats.last_step_offloaded_bytes > 0
        assert pool_in_use() == before, (pool_in_use() - before, offload.stats.last_step_offloaded_bytes)
    assert pool_reserved() > 0
    offload.close()
    assert pool_in_use() == before
    assert pool_reserved() <= before, pool_reserved()
    plain = step(model, x)
    assert_bit_equal(plain, step(model, x, offload))  # usable after close


class SharedBlocks(torch.nn.Module):
    """g is saved by sigmoid whole and by pow as a strided slice (not offloadable): its
    storage stays on the GPU whatever happens to the whole view, so copying it frees
    nothing. k is saved by tanh and again by the matmul: one block, both or neither."""

    def __init__(self, d=512):
        super().__init__()
        self.w1 = torch.nn.Parameter(torch.randn(d, d) / d ** 0.5)
        self.w2 = torch.nn.Parameter(torch.randn(d, d) / d ** 0.5)

    def forward(self, x):
        h = x @ self.w1
        g = torch.sigmoid(h)
        k = torch.tanh(h)
        return g[:, ::2].pow(2).sum() + (k @ self.w2).sum()


@pytest.mark.gpu
@pytest.mark.parametrize("budget, blocks", [({"max_overhead": 10.0}, 1), ({"max_bytes": 1 << 40}, 2), ({}, 2)])
def test_a_block_held_by_a_kept_save_is_not_copied(gpu, budget, blocks):
    """max_overhead's timed step sees g's kept slice and leaves g (k goes); the other
    modes decide at g's first save, before the slice exists (g and k go), and k's
    second save never copies again."""
    torch.manual_seed(5)
    model = SharedBlocks().cuda()
    x = torch.randn(4096, 512, device="cuda")
    plain = step(model, x)
    offload = ft.offload_activations(min_bytes=0, **budget)
    for _ in range(offload_module.PLANNING_STEPS + 1):  # max_overhead offloads after its planning steps
        assert_bit_equal(plain, step(model, x, offload))
    assert offload.stats.last_step_offloaded_bytes == blocks * 4096 * 512 * 4, offload.stats.as_dict()


@pytest.mark.gpu
def test_an_exception_mid_step_leaves_no_pinned_memory_held(cuda_model):
    model, x = cuda_model
    gc.collect()
    torch.cuda.synchronize()
    before = pool_in_use()
    offload = ft.offload_activations(min_bytes=0)
    with pytest.raises(RuntimeError, match="boom"):
        with offload:
            loss = model(x)
            assert offload.stats.offloaded_tensors > 0
            raise RuntimeError("boom")
    del loss
    gc.collect()
    offload._reap()
    assert pool_in_use() == before
    plain = step(model, x)
    assert_bit_equal(plain, step(model, x, offload))  # the object works on after it


@pytest.mark.gpu
def test_several_gpus_each_tensor_on_its_own(gpu):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices")
    torch.manual_seed(2)
    a, b = InplaceMLP().to("cuda:0"), InplaceMLP().to("cuda:1")

    class Two(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = a, b

        def forward(self, x):
            return self.a(x) + self.b(x.to("cuda:1")).to("cuda:0")

    model = Two()
    x = torch.randn(8, 128, 256, device="cuda:0")
    plain = step(model, x)
    offload = ft.offload_activations(min_bytes=0)
    assert_bit_equal(plain, step(model, x, offload))
    assert len(offload._lanes) == 2


LLAMA = """
    import os, torch, ferry.torch as ft
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.use_deterministic_algorithms(True)
    cfg = LlamaConfig(hidden_size=256, intermediate_size=704, num_hidden_layers=3, num_attention_heads=8,
                      num_key_value_heads=4, vocab_size=1000, max_position_embeddings=256)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to("cuda", torch.bfloat16)
    model.config._attn_implementation = "eager"
    ids = torch.randint(0, 1000, (2, 128), device="cuda")
    def step(offload):
        model.zero_grad(set_to_none=True)
        def run():
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            return loss
        if offload is None:
            loss = run()
        else:
            with offload:
                loss = run()
        return loss.detach().clone(), [p.grad.clone() for p in model.parameters()]
    plain = step(None)
    again = step(None)
    assert torch.equal(again[0], plain[0]) and all(torch.equal(g, h) for g, h in zip(again[1], plain[1])), \
        "the step without offload is not deterministic here: no bit-equality to check against"
    offload = ft.offload_activations(min_bytes=0)
    for _ in range(2):
        loss, grads = step(offload)
        assert torch.equal(loss, plain[0]), (loss, plain[0])
        bad = [(i, float((g.float() - h.float()).abs().max())) for i, (g, h) in enumerate(zip(grads, plain[1]))
               if not torch.equal(g, h)]
        assert not bad, f"gradients differ (index, max diff): {bad}"
    assert offload.stats.offloaded_tensors > 0
    print("llama ok", offload.stats.offloaded_tensors, offload.stats.last_step_offloaded_bytes)
"""


@pytest.mark.gpu
def test_a_transformers_llama_step_is_bit_equal(gpu):
    pytest.importorskip("transformers")
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(LLAMA)], capture_output=True, text=True,
                       timeout=300, env={**__import__("os").environ, "CUBLAS_WORKSPACE_CONFIG": ":4096:8"})
    assert r.returncode == 0 and "llama ok" in r.stdout, r.stdout + r.stderr[-3000:]


def test_dense_means_one_block_in_some_stride_order():
    from ferry.torch.offload import _dense

    x = torch.randn(4, 5, 6)
    assert _dense(x) and _dense(x.transpose(0, 2)) and _dense(x.permute(1, 2, 0)) and _dense(torch.randn(4, 1, 6))
    assert not _dense(x[:, 1:3]) and not _dense(x[::2]) and not _dense(x[..., :3])
    assert not _dense(torch.randn(3, 1).expand(3, 4)) and not _dense(torch.empty(0))


COMPILED = """
    import torch, ferry.torch as ft
    torch.manual_seed(4)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256)).cuda()
    compiled = torch.compile(model)
    x = torch.randn(32, 128, 256, device="cuda")
    def step(offload):
        model.zero_grad(set_to_none=True)
        if offload is None:
            loss = compiled(x).pow(2).mean(); loss.backward()
        else:
            with offload:
                loss = compiled(x).pow(2).mean(); loss.backward()
        return loss.detach().clone(), [p.grad.clone() for p in model.parameters()]
    plain = step(None)
    offload = ft.offload_activations(min_bytes=0)
    for _ in range(2):
        loss, grads = step(offload)
        assert torch.equal(loss, plain[0]) and all(torch.equal(g, h) for g, h in zip(grads, plain[1]))
    print("compiled ok", offload.stats.offloaded_tensors, offload.stats.kept_tensors)
"""


@pytest.mark.gpu
def test_a_compiled_module_steps_bit_equal_under_offload(gpu):
    """torch.compile'd forward: what its graph saves reaches the hooks or stays; either
    way the step is right (the count printed says which)."""
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(COMPILED)], capture_output=True, text=True,
                       timeout=600)
    if r.returncode != 0 and ("BackendCompilerFailed" in r.stderr or "triton" in r.stderr.lower()):
        pytest.skip("torch.compile cannot compile here: " + r.stderr.strip().splitlines()[-1])
    assert r.returncode == 0 and "compiled ok" in r.stdout, r.stdout + r.stderr[-3000:]


FSDP2 = """
    import contextlib, os, sys, torch, torch.distributed as dist, ferry.torch as ft
    from torch.distributed.fsdp import fully_shard
    rank, budget = int(sys.argv[1]), sys.argv[2]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[3], NCCL_NVLS_ENABLE="0")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=2)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(7)  # the same weights on both ranks before sharding
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(),
                                                      torch.nn.Linear(2048, 512)) for _ in range(4)]).cuda()
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    g = torch.Generator(device="cuda").manual_seed(100 + rank)  # each rank its own batch
    x = torch.randn(8, 256, 512, device="cuda", generator=g)
    def step(offload):
        model.zero_grad(set_to_none=True)
        with offload if offload is not None else contextlib.nullcontext():
            loss = model(x).pow(2).mean()
            loss.backward()
        return loss.detach().clone(), [p.grad.to_local().clone() for p in model.parameters()]
    plain = step(None)
    offload = ft.offload_activations(min_bytes=0) if budget == "full" else \\
        ft.offload_activations(min_bytes=0, max_overhead=10.0)
    for _ in range(5):  # past max_overhead's planning steps
        loss, grads = step(offload)
        assert torch.equal(loss, plain[0]), (rank, loss, plain[0])
        bad = [i for i, (a, b) in enumerate(zip(grads, plain[1])) if not torch.equal(a, b)]
        assert not bad, f"rank {rank}: gradient shards {bad} differ"
    assert offload.stats.last_step_offloaded_bytes > 0, offload.stats.as_dict()
    dist.destroy_process_group()
    print(f"fsdp2 rank {rank} ok", offload.stats.last_step_offloaded_bytes)
"""


@pytest.mark.gpu
@pytest.mark.parametrize("budget", ["full", "max_overhead"])
def test_fsdp2_on_two_gpus_each_rank_bit_equal(gpu, budget):
    """FSDP2 (fully_shard), one process per GPU, each offloading: every rank's loss and
    gradient shards are bit-equal to its step without offload (issue 42 item 3)."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices (FSDP2, one process per GPU)")
    import socket

    with socket.socket() as s:  # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    script = textwrap.dedent(FSDP2)
    ranks = [subprocess.Popen([sys.executable, "-c", script, str(r), budget, port], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(2)]
    outs = []
    for p in ranks:
        try:
            outs.append(p.communicate(timeout=300))
        except subprocess.TimeoutExpired:
            for q in ranks:
                q.kill()
            pytest.fail("an FSDP2 rank did not finish within 300 s")
    for r, (p, (out, err)) in enumerate(zip(ranks, outs)):
        assert p.returncode == 0 and f"fsdp2 rank {r} ok" in out, out + err[-3000:]


@pytest.mark.gpu
@pytest.mark.parametrize("amp, checkpoint", [(True, False), (False, True), (True, True)])
def test_the_budgeted_mode_under_autocast_and_checkpoint_is_bit_equal(cuda_model, amp, checkpoint):
    """max_overhead through its planning steps and after, under autocast and with a
    checkpointed region beside the offloaded half (issue 42 item 3)."""
    model, x = cuda_model
    plain = step(model, x, amp=amp, checkpoint=checkpoint)
    offload = ft.offload_activations(min_bytes=0, max_overhead=10.0)
    for _ in range(offload_module.PLANNING_STEPS + 2):
        assert_bit_equal(plain, step(model, x, offload, amp=amp, checkpoint=checkpoint))
    assert offload.stats.last_step_offloaded_bytes > 0, offload.stats.as_dict()
