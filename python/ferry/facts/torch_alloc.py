"""PyTorch's allocator settings in this process's environment, as PyTorch's CUDA
allocator would read them (parsers/torch_alloc.py holds PyTorch's rules): whether
its pinned memory is made by registration (pinned_use_cuda_host_register:True),
which is anonymous memory that the kernel copies into every child at fork().

Reads the environment only: PyTorch is not imported, and a setting made from
Python (torch.cuda.memory._set_allocator_settings) is not seen.
"""

from __future__ import annotations

from collections.abc import Mapping

from . import parsers


def collect_torch_alloc_conf(environ: Mapping[str, str]) -> dict:
    """{"variable", "value", "shadowed", "pinned_use_host_register", "error"}:

    variable: the variable PyTorch's CUDA allocator reads (PYTORCH_CUDA_ALLOC_CONF,
      else PYTORCH_ALLOC_CONF), None when neither is set; value: its text;
    shadowed: the other variables that are set but not read for the CUDA keys;
    pinned_use_host_register: True when PyTorch pins by cudaHostRegister, False
      when by cudaHostAlloc (its default), None when PyTorch refuses the text;
    error: why PyTorch refuses it (its first CUDA allocation raises), else None."""
    found = parsers.alloc_conf_variable(environ)
    out = {"variable": None, "value": None, "shadowed": [], "pinned_use_host_register": False, "error": None}
    if found is None:
        return out
    name, text = found
    out.update(variable=name, value=text,
               shadowed=[v for v in parsers.ALLOC_CONF_VARIABLES if v != name and v in environ])
    try:
        out["pinned_use_host_register"] = parsers.pinned_use_host_register(text)
    except ValueError as exc:
        out.update(pinned_use_host_register=None, error=str(exc))
    return out
