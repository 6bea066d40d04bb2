"""`pip install 'ferry[torch]'` is enough for ferry.torch: run by scripts/test in a fresh
venv holding the wheel with that extra alone (no [test], whose numpy would hide a missing
dependency), it runs a DataLoader with workers, as a new user's first program would, and
exits 1 naming what failed. Issue 38, item 13: the workers said "Numpy is not available"
(the slots are filled through tensor.numpy()) because the extra installed PyTorch only.

Not a pytest file (pytest collects test_*.py): it checks an environment, not the code.
"""

import sys

import torch

import ferry.torch


class Squares(torch.utils.data.Dataset):
    """Item i: (a float32 row of i * i, the int i)."""

    def __len__(self):
        return 10

    def __getitem__(self, i):
        return torch.full((3,), float(i * i)), i


def pairs(batch):  # a custom collate_fn: its tensors are copied into the slot
    return torch.stack([x for x, _ in batch]), torch.tensor([i for _, i in batch])


def main() -> int:
    for workers in (0, 2):
        for collate in (None, pairs):
            got = [(x.clone(), i.clone()) for x, i in
                   ferry.torch.DataLoader(Squares(), batch_size=4, num_workers=workers, collate_fn=collate)]
            ids = [int(i) for _, labels in got for i in labels]
            rows = torch.cat([x for x, _ in got])
            want = torch.tensor([[float(i * i)] * 3 for i in range(10)])
            if ids != list(range(10)) or not torch.equal(rows, want):
                print(f"check_torch_extra: FAILED: num_workers={workers}, collate_fn={collate}: "
                      f"labels {ids}, rows {rows.tolist()}", file=sys.stderr)
                return 1
    print(f"check_torch_extra: ferry.torch.DataLoader ran, with and without workers, with PyTorch "
          f"{torch.__version__} and what the [torch] extra installed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
