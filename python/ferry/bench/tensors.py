"""`ferry bench tensors`: a transformer-shaped set of tensors (a state_dict) between
pageable CPU memory and the GPU, the way a user moves it.

The ways, in one run:

  ferry.torch.to_device(dict)      one call for the whole dict (one pipelined copy)
  .to("cuda") loop                 PyTorch, one tensor at a time
  ferry.torch.to_device per tensor ferry, one call per tensor
  and back: ferry.torch.to_host(dict), a .cpu() loop, to_host per tensor.

Default: 12 layers of bf16 4096x4096 (x4), 11008x4096 (x2), 4096x11008 and two
4096-element norms: 108 tensors, ~4.9 GB. Every result is verified against the
source. Median of --repeats; GB/s = 1e9 bytes/s, end to end (call to synchronize).
"""

from __future__ import annotations

import statistics
import time

from .records import Records
from .suite import Suite, add_repeats, missing_module

DEFAULT_LAYER = "4096x4096*4,11008x4096*2,4096x11008,4096*2"


def parse_layer(text: str) -> list[tuple[int, ...]]:
    """'4096x4096*4,4096*2' -> [(4096, 4096)] * 4 + [(4096,)] * 2."""
    from ..errors import InvalidArgumentError

    shapes = []
    for part in text.split(","):
        part = part.strip()
        shape_text, _, count = part.partition("*")
        try:
            shape = tuple(int(d) for d in shape_text.split("x"))
            n = int(count) if count else 1
        except ValueError:
            raise InvalidArgumentError(f"--layer: bad shape {part!r} (expected e.g. 4096x4096*4)") from None
        if n < 1 or any(d < 0 for d in shape):
            raise InvalidArgumentError(f"--layer: bad shape {part!r}")
        shapes += [shape] * n
    return shapes


BASELINES = {"h2d": '.to("cuda") loop', "d2h": ".cpu() loop"}


def records(rows: list[dict], tensors: int, nbytes: int, dtype: str, repeats: int) -> list[dict]:
    """Seconds and GB/s of moving the whole state dict per case and direction,
    compared with PyTorch's per-tensor loop in the same direction."""
    out = Records(TensorsSuite.key)
    for direction, base in BASELINES.items():
        sel = [r for r in rows if r["direction"] == direction]
        params = {"direction": direction, "tensors": tensors, "nbytes": nbytes, "dtype": dtype, "repeats": repeats}
        for metric, key, unit in (("time", "seconds", "s"), ("bandwidth", "gbps", "GB/s")):
            out.compare(params, metric, unit, {r["case"]: r[key] for r in sel}, baseline=base)
    return out.items


class TensorsSuite(Suite):
    key = "tensors"
    description = "a transformer-shaped state_dict to the GPU and back: to_device(dict) vs a .to loop"

    def add_arguments(self, p):
        p.add_argument("--layers", type=int, default=12, help="layers (default: %(default)s)")
        p.add_argument("--layer", default=DEFAULT_LAYER, help="shapes of one layer (default: %(default)s)")
        p.add_argument("--dtype", default="bfloat16", help="torch dtype (default: %(default)s)")
        add_repeats(p, 3, "timed runs per case")

    def waived(self, args):
        why = super().waived(args)
        if why:
            return why
        return missing_module("torch")

    def run(self, args) -> int:
        import torch

        import ferry.torch as ft

        from ..units import fmt_bytes as format_bytes
        from .report import progress, write_json

        dtype = getattr(torch, args.dtype)
        shapes = parse_layer(args.layer)
        g = torch.Generator().manual_seed(1)
        sd = {}
        for layer in range(args.layers):
            for i, shape in enumerate(shapes):
                sd[f"layers.{layer}.{i}"] = torch.randn(shape, generator=g, dtype=torch.float32).to(dtype)
        total = sum(t.numel() * t.element_size() for t in sd.values())
        progress(f"tensors: {len(sd)} tensors, {format_bytes(total)}")
        dev = torch.device("cuda", 0)

        def timed(fn):
            times = []
            out = None
            for _ in range(args.repeats + 1):  # the first run warms up
                out = None
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                out = fn()
                torch.cuda.synchronize()
                times.append(time.perf_counter() - t0)
            return statistics.median(times[1:]), out

        def check_on_device(out):
            for k, v in sd.items():
                if not torch.equal(out[k].cpu(), v):
                    raise AssertionError(f"tensors: {k} arrived wrong")

        def check_on_host(out):
            for k, v in sd.items():
                if out[k].is_cuda or not torch.equal(out[k], v):
                    raise AssertionError(f"tensors: {k} came back wrong")

        rows = []
        cases_h2d = [
            ("ferry.torch.to_device(dict)", lambda: ft.to_device(sd, dev)),
            ('.to("cuda") loop', lambda: {k: v.to(dev) for k, v in sd.items()}),
            ("ferry.torch.to_device per tensor", lambda: {k: ft.to_device(v, dev) for k, v in sd.items()}),
        ]
        on_gpu = None
        for name, fn in cases_h2d:
            seconds, out = timed(fn)
            check_on_device(out)
            on_gpu = out
            rows.append({"direction": "h2d", "case": name, "seconds": seconds, "gbps": total / seconds / 1e9})
            progress(f"tensors: h2d {name}: {total / seconds / 1e9:.1f} GB/s")
        cases_d2h = [
            ("ferry.torch.to_host(dict)", lambda: ft.to_host(on_gpu)),
            (".cpu() loop", lambda: {k: v.cpu() for k, v in on_gpu.items()}),
            ("ferry.torch.to_host per tensor", lambda: {k: ft.to_host(v) for k, v in on_gpu.items()}),
        ]
        for name, fn in cases_d2h:
            seconds, out = timed(fn)
            check_on_host(out)
            rows.append({"direction": "d2h", "case": name, "seconds": seconds, "gbps": total / seconds / 1e9})
            progress(f"tensors: d2h {name}: {total / seconds / 1e9:.1f} GB/s")

        base = {r["direction"]: r["gbps"] for r in rows if r["case"] in ('.to("cuda") loop', ".cpu() loop")}
        print(f"{len(sd)} tensors, {format_bytes(total)} ({args.dtype}), median of {args.repeats}, data verified")
        print(f"{'direction':<10}{'case':<36}{'seconds':>10}{'GB/s':>8}{'vs PyTorch loop':>18}")
        for r in rows:
            r["ratio"] = r["gbps"] / base[r["direction"]]
            print(f"{r['direction']:<10}{r['case']:<36}{r['seconds']:>10.3f}{r['gbps']:>8.1f}{r['ratio']:>17.2f}x")
        write_json(args.json, self.key, records(rows, len(sd), total, args.dtype, args.repeats))
        return 0


SUITE = TensorsSuite()
main = SUITE.main
