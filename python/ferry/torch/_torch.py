"""The one place ferry.torch imports PyTorch, with an error that says how to get it."""


def torch_module():
    try:
        import torch
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("ferry.torch needs PyTorch: pip install 'ferry[torch]'") from e
    return torch
