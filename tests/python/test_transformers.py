"""A real client: transformers. docs/loading.md's recipe (a model built on the GPU, filled
by ferry.torch.load_safetensors from save_pretrained's files) gives
from_pretrained's logits; a state dict saved by ferry.torch.save_safetensors
beside the model's config.json loads with from_pretrained. Skips without
transformers (and, where a GPU is needed, without a GPU)."""

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import ferry.torch as ft  # noqa: E402


def tiny_llama(tie: bool, seed: int = 0):
    cfg = transformers.LlamaConfig(vocab_size=257, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   tie_word_embeddings=tie)
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(cfg)
    with torch.no_grad():  # random everywhere, norms included (their default is ones)
        for p in model.parameters():
            p.normal_(0, 0.5)
    return model.eval()


def logits(model, device):
    ids = torch.arange(0, 40, device=device).remainder(257).view(2, 20)
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


@pytest.mark.gpu
@pytest.mark.parametrize("tie", [False, True])
def test_readme_recipe_logits_equal_from_pretrained(tmp_path, gpu, tie):
    tiny_llama(tie).save_pretrained(tmp_path, max_shard_size="100KB")  # several shards and an index
    path = str(tmp_path)
    try:  # as the issue measured it (needs accelerate in transformers 4.x)
        ref = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, device_map="cuda")
    except (ImportError, ValueError):
        ref = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to("cuda")
    ref.eval()
    # docs/loading.md:
    cfg = transformers.AutoConfig.from_pretrained(path)
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    ft.load_safetensors(path, out=model.state_dict(), dtype=model.dtype)
    model.eval()
    want = ref.state_dict()
    for k, v in model.state_dict().items():
        assert torch.equal(v, want[k]), k
    assert torch.equal(logits(model, "cuda"), logits(ref, "cuda"))


def _saved_by_ferry_loads_with_from_pretrained(tmp_path, device, shard):
    model = tiny_llama(tie=True, seed=3).to(device)
    sd = model.state_dict()
    written = ft.save_safetensors(sd, tmp_path / "model.safetensors", shared="keep_one",
                                  max_shard_size=100_000 if shard else None)
    assert written[-1].endswith("model.safetensors.index.json" if shard else "model.safetensors")
    model.config.save_pretrained(tmp_path)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32).to(device).eval()
    got = loaded.state_dict()
    assert set(got) == set(sd)
    for k, v in sd.items():
        assert torch.equal(got[k], v), k
    assert torch.equal(logits(loaded, device), logits(model, device))


@pytest.mark.parametrize("shard", [False, True])
def test_saved_by_ferry_loads_with_from_pretrained_cpu(tmp_path, shard):
    _saved_by_ferry_loads_with_from_pretrained(tmp_path, "cpu", shard)


@pytest.mark.gpu
@pytest.mark.parametrize("shard", [False, True])
def test_saved_by_ferry_from_gpu_loads_with_from_pretrained(tmp_path, gpu, shard):
    _saved_by_ferry_loads_with_from_pretrained(tmp_path, "cuda", shard)
