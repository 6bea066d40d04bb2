"""The rules' readers of facts and measurements: a value of the expected type or
None for "unknown"; a value of the wrong type or shape raises InvalidArgumentError
(the rule then becomes a "could not be evaluated" finding)."""

from __future__ import annotations

import math
from typing import Any, Optional

from ..errors import InvalidArgumentError
from ..units import link_limit
from ..units import fmt_bytes as _fmt_bytes

from ..facts.parsers import cpulist_ids, thp_setting
from .thresholds import DEFAULT_POOL_BYTES


def _dict(value: Any, what: str) -> dict:
    """`value` as a dict; None means unknown and gives {}. Anything else is an error."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidArgumentError(f"{what} must be an object, got {type(value).__name__} {value!r}")
    return value


def _list(value: Any, what: str) -> list:
    if value is None:
        return []
    if not isinstance(value, (list, tuple)):
        raise InvalidArgumentError(f"{what} must be a list, got {type(value).__name__} {value!r}")
    return list(value)


def _num(value: Any, what: str) -> Optional[float]:
    """A number, or None when unknown. Booleans and strings are errors (quoted)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidArgumentError(f"{what} must be a number, got {type(value).__name__} {value!r}")
    if math.isnan(value):
        return None
    return value


def _typed(value: Any, what: str, kind: type, name: str) -> Any:
    """`value` when it is a `kind`, None when unknown; anything else is an error."""
    if value is None:
        return None
    if not isinstance(value, kind):
        raise InvalidArgumentError(f"{what} must be {name}, got {type(value).__name__} {value!r}")
    return value


def _str(value: Any, what: str) -> Optional[str]:
    return _typed(value, what, str, "a string")


def _bool(value: Any, what: str) -> Optional[bool]:
    return _typed(value, what, bool, "true or false")


def _sysfs_choice(value: Any, what: str) -> Optional[str]:
    """A THP setting: "madvise" or the raw sysfs form "always [madvise] never"
    (facts.parsers.thp_setting: one parser for both). Garbage is a ValueError."""
    text = _str(value, what)
    if text is None:
        return None
    try:
        return thp_setting(text)
    except ValueError as e:
        raise InvalidArgumentError(f"{what}: {e}") from None


# The cpulist parser of ferry (facts.parsers): "0-3,8,10-15", "0-31:2/4" -> a set of
# ids; ValueError quoting the text for anything else.
parse_cpulist = cpulist_ids


def _cpus(value: Any, what: str) -> Optional[set[int]]:
    text = _str(value, what)
    return None if text is None else parse_cpulist(text)


def _host(facts: dict) -> dict:
    return _dict(facts.get("host"), "host")


def _gpus(facts: dict) -> list[tuple[str, dict]]:
    """(index as a string, gpu dict) for every GPU; the index falls back to position."""
    out = []
    for pos, gpu in enumerate(_list(facts.get("gpus"), "gpus")):
        gpu = _dict(gpu, f"gpus[{pos}]")
        index = gpu.get("index")
        out.append((str(pos if index is None else index), gpu))
    return out


def _gpu_label(key: str, gpu: dict) -> str:
    extras = [x for x in (gpu.get("name"), gpu.get("pci_bus_id")) if x]
    return f"GPU {key}" + (f" ({', '.join(str(x) for x in extras)})" if extras else "")


def _per_gpu(measurements: dict, name: str, key: str) -> Optional[float]:
    """A per-GPU measurement {gpu_index(str): GB/s}; int keys are accepted too."""
    table = _dict(measurements.get(name), name)
    value = table.get(key)
    if value is None and key.isdigit():
        value = table.get(int(key))
    return _num(value, f"{name}[{key}]")


def _link(gpu: dict, key: str, m: dict) -> tuple[Optional[float], str]:
    """The link's per-direction limit for a GPU (units.link_limit, given its pinned
    copies) and how it is named in evidence ("current link", "maximum link")."""
    pinned = [_per_gpu(m, f"pinned_{d}_gbps", key) for d in ("h2d", "d2h")]
    return link_limit(_num(gpu.get("link_gbps"), f"gpus[{key}].link_gbps"),
                      _num(gpu.get("max_link_gbps"), f"gpus[{key}].max_link_gbps"),
                      [x for x in pinned if x is not None])


def _pool_bytes(measurements: dict) -> tuple[int, str]:
    """Planned pinned pool size and how to name it ("planned" or "assumed default")."""
    planned = _num(measurements.get("pool_bytes_planned"), "pool_bytes_planned")
    if planned is None or planned <= 0:
        return DEFAULT_POOL_BYTES, f"{_fmt_bytes(DEFAULT_POOL_BYTES)} (assumed default)"
    return int(planned), f"{_fmt_bytes(planned)} (planned)"


def _virt_kind(host: dict) -> Optional[str]:
    virt = _dict(host.get("virtualization"), "host.virtualization")
    kind = _str(virt.get("kind"), "host.virtualization.kind")
    if kind is None or kind.strip().lower() in ("", "unknown"):
        return None
    return kind.strip().lower()


def _numa_fix(node: Any) -> str:
    return (
        f"run the process on the GPU's node: `numactl --cpunodebind={node} --membind={node} "
        f"<command>` (docker: `--cpuset-cpus=<the GPU's cpus> --cpuset-mems={node}`); "
        "with GPUs on several nodes, run one process per GPU, each bound to its GPU's node"
    )
