"""How ferry.torch gets PyTorch: ``torch_module()`` imports it on first use, with
an error that says how to install it (``import ferry.torch`` imports no PyTorch).
ferry.torch.data, imported on the first use of ``DataLoader`` (it subclasses
PyTorch's), imports torch at its top once ``torch_module()`` has found it.

PyTorch's public API only: its private names are in _torch_private.py alone."""


def torch_module():
    try:
        import torch
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("ferry.torch needs PyTorch: pip install 'ferry[torch]'") from e
    return torch
