"""Every code block of README.md and docs/*.md says what it is by its fence's language,
and every ```python block runs (issue 38, item 15: docs/pools.md's example raised
BufferError; nothing ran the examples).

- Languages: python (run here), sh (commands: tests/python/test_docs.py checks the
  `ferry ...` ones), c (C), text (program output, diagrams, trees: never run). A fence
  without a language fails: say which of these it is.
- A python block runs in a fresh interpreter (an example may set the allocator, fork
  workers or pin memory), as the page shows it, after a setup of its own in EXAMPLES
  below that makes what the page leaves to the reader (`model`, `path`, `dataset`, a
  checkpoint in a temporary directory) and nothing else. Tracebacks name the page and
  its line.
- On the CPU where the block can run there (its setup's `needs` has no "gpu"); blocks
  that need a GPU take the `gpu` fixture and skip, saying so, where there is none. A
  block may carry both (node.md's pool without and with `device=`).
- A block that cannot run as one program opts out with a first line
  `# not run by tests: WHY` (two processes side by side, a shared directory), and the
  test that runs it instead where there is one.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
LANGUAGES = {"python", "sh", "c", "text"}
OPT_OUT = re.compile(r"^# not run by tests: (\S.*)$")


@dataclasses.dataclass(frozen=True)
class Block:
    page: str      # README.md, docs/pools.md
    line: int      # the fence's line (1-based)
    lang: str
    body: str

    @property
    def first(self) -> str:
        return next((ln for ln in self.body.splitlines() if ln.strip()), "")

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def blocks_of(page: pathlib.Path) -> list[Block]:
    out, lang, start, body = [], None, 0, []
    for n, line in enumerate(page.read_text().splitlines(), 1):
        fence = re.match(r"^\s*```(\S*)", line)
        if fence and lang is None:
            lang, start, body = fence.group(1), n, []
        elif fence:
            out.append(Block(str(page.relative_to(ROOT)), start, lang, "\n".join(body)))
            lang = None
        elif lang is not None:
            body.append(line)
    assert lang is None, f"{page}: a ``` fence opened at line {start} is not closed"
    return out


ALL_BLOCKS = [b for p in PAGES for b in blocks_of(p)]
PYTHON_BLOCKS = [b for b in ALL_BLOCKS if b.lang == "python"]


# ---- what each page leaves to the reader ----------------------------------------------

# A small checkpoint of two tensors, for the loading examples: the directory `path`.
CHECKPOINT = """
import tempfile, torch, ferry.torch
path = tempfile.mkdtemp(dir=".")
ferry.torch.save_safetensors({"q.weight": torch.randn(4096, 16), "o.weight": torch.randn(16, 4096)},
                             f"{path}/model.safetensors")
"""

# A transformers model of a few KiB saved as the reader's `path`.
TINY_LLAMA = """
import tempfile, torch, transformers
path = tempfile.mkdtemp(dir=".")
cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2)
transformers.LlamaForCausalLM(cfg).save_pretrained(path)
"""


# Node pools are found by name among this user's processes: each example's pools get
# names of their own (the name shown, then the process id), so that tests running
# beside other processes of the user never attach to theirs.
UNIQUE_POOLS = """
import os, ferry.node
class _NodePool(ferry.node.NodePool):
    def __init__(self, name, *args, **kwargs):
        super().__init__(f"{name}-{os.getpid()}", *args, **kwargs)
ferry.node.NodePool = _NodePool
"""

# node.md's ranks: this process is rank 0 and its own peer.
NODE_RANK = """
rank = 0
def send_to_peer(h):
    global handle
    handle = h
"""


@dataclasses.dataclass(frozen=True)
class Example:
    setup: str = ""
    needs: tuple[str, ...] = ()   # "gpu", or modules that must import (torch, transformers)
    env: tuple[tuple[str, str], ...] = ()
    variant: str = "as shown"


# (page, the block's first line) -> how it runs (every block of the page that starts so);
# several: each runs. A python block without an entry runs with no setup.
EXAMPLES: dict[tuple[str, str], list[Example]] = {
    ("docs/channel.md", "import ferry, torch"): [Example(
        setup="import torch\nflag_tensor = torch.zeros(1, dtype=torch.int32, device='cuda')",
        needs=("gpu", "torch"))],
    ("docs/copies.md", "import numpy as np, torch, ferry, ferry.torch"): [Example(
        setup="""
import torch
model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
gpu_blocks = [torch.empty(1 << 16, dtype=torch.uint8, device="cuda") for _ in range(8)]
host_blocks = [torch.full((1 << 16,), i, dtype=torch.uint8) for i in range(8)]
""", needs=("gpu", "torch", "numpy"))],
    ("docs/copies.md", "import torch, ferry"): [Example(setup="", needs=("gpu", "torch"))],
    ("docs/dataloader.md", "import ferry.torch"): [Example(
        setup="""
import torch
dataset = torch.utils.data.TensorDataset(torch.randn(2048, 3, 8, 8), torch.randint(0, 10, (2048,)))
""", needs=("gpu", "torch"))],
    ("docs/loading.md", "import torch, transformers, ferry.torch"): [Example(
        setup=TINY_LLAMA, needs=("gpu", "torch", "transformers"))],
    ("docs/loading.md", "tp, r = 4, rank  # column-parallel q, row-parallel o: this rank's quarter of each"):
        [Example(setup=CHECKPOINT + "rank = 1\n", needs=("gpu", "torch"))],
    ("docs/loading.md", "import os, ferry.node, ferry.torch"): [Example(
        setup=UNIQUE_POOLS + CHECKPOINT, needs=("gpu", "torch"), env=(("LOCAL_RANK", "0"), ("LOCAL_WORLD_SIZE", "1")))],
    ("docs/managed-memory.md", "import torch, ferry.torch"): [Example(needs=("gpu", "torch"))],
    ("docs/node.md", "from ferry.node import NodePool"): [
        Example(setup=UNIQUE_POOLS + NODE_RANK + "local_rank = None\n", variant="device-None"),
        Example(setup=UNIQUE_POOLS + NODE_RANK + "local_rank = 0\n", variant="device-0", needs=("gpu",)),
    ],
    ("docs/offload.md", "import ferry.torch"): [Example(
        setup="""
import torch
class Model(torch.nn.Module):  # returns what a transformers model does: .loss
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 512))
    def forward(self, x):
        return type("Output", (), {"loss": self.layers(x).square().mean()})()
model = Model().cuda()
loader = [{"x": torch.randn(64, 512, device="cuda")} for _ in range(3)]
opt = torch.optim.SGD(model.parameters(), lr=0.1)
""", needs=("gpu", "torch"))],
    ("docs/pools.md", "import ferry, torch, ferry.torch"): [Example(needs=("gpu", "torch"))],
    ("docs/saving.md", "import ferry.torch"): [Example(
        setup="""
import json, tempfile, torch
class Config:  # a transformers config's save_pretrained
    def save_pretrained(self, d):
        json.dump({"model_type": "doc-example"}, open(f"{d}/config.json", "w"))
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8))
model.config = Config()
d = tempfile.mkdtemp(dir=".")
steps = 2001
def train_step():
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
""", needs=("torch",))],
}


def cases():
    out = []
    for b in PYTHON_BLOCKS:
        for ex in EXAMPLES.get((b.page, b.first), [Example()]):
            out.append(pytest.param(b, ex, id=b.where + ("" if ex.variant == "as shown" else f"-{ex.variant}")))
    return out


RUNNER = """
import os, sys
os.chdir({tmp!r})
{setup}
__doc_source = open({src!r}).read()
exec(compile("\\n" * {offset} + __doc_source, {page!r}, "exec"))
"""


def run_block(block: Block, example: Example, tmp: pathlib.Path) -> subprocess.CompletedProcess:
    src = tmp / "block.py"
    src.write_text(block.body + "\n")
    setup = textwrap.dedent(example.setup)
    script = tmp / "run.py"
    script.write_text(RUNNER.format(tmp=str(tmp), setup=setup, src=str(src), offset=block.line,
                                    page=str(ROOT / block.page)))
    env = dict(os.environ, **dict(example.env))
    return subprocess.run([sys.executable, str(script)], cwd=tmp, capture_output=True, text=True,
                          env=env, timeout=600)


# ---- the tests ------------------------------------------------------------------------


@pytest.mark.parametrize("block", ALL_BLOCKS, ids=[b.where for b in ALL_BLOCKS])
def test_every_block_names_its_language(block):
    assert block.lang in LANGUAGES, (
        f"{block.where}: a ```{block.lang} block (first line {block.first!r}): fence it as one of "
        f"{', '.join(sorted(LANGUAGES))} (text: output, a diagram or a tree; only python runs)")


@pytest.mark.parametrize("block,example", cases())
def test_python_block_runs(block, example, request, tmp_path):
    why = OPT_OUT.match(block.first)
    if why:
        pytest.skip(f"{block.where}: marked not run by tests: {why.group(1)}")
    missing = [m for m in example.needs if m != "gpu" and importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"{block.where} needs {', '.join(missing)} (not installed)")
    if "gpu" in example.needs:
        request.getfixturevalue("gpu")
    run = run_block(block, example, tmp_path)
    assert run.returncode == 0, (
        f"the example at {block.where} ({example.variant}) fails:\n{run.stderr[-4000:]}{run.stdout[-2000:]}")


def test_every_setup_is_for_a_block_that_exists():
    firsts = {(b.page, b.first) for b in PYTHON_BLOCKS}
    stale = sorted(k for k in EXAMPLES if k not in firsts)
    assert not stale, ("EXAMPLES has setups for python blocks that are not in the docs "
                       f"(the block's first line changed? update the key): {stale}")


def test_opting_out_says_why():
    for b in PYTHON_BLOCKS:
        if "not run by tests" in b.body:
            assert OPT_OUT.match(b.first), f"{b.where}: the marker must be the block's first line: " \
                                           "'# not run by tests: WHY'"
