"""PyTorch's allocator settings (PYTORCH_CUDA_ALLOC_CONF, PYTORCH_ALLOC_CONF) as
PyTorch's CUDA allocator reads them, for the one key ferry's doctor asks about:
pinned_use_cuda_host_register (PyTorch's pinned memory made by malloc plus
cudaHostRegister instead of cudaHostAlloc).

The rules are PyTorch 2.11's (c10/core/AllocatorConfig.h: ConfigTokenizer;
c10/cuda/CUDAAllocatorConfig.{h,cpp}: instance(), parseArgs,
parsePinnedUseCudaHostRegister), followed step by step:
  - the variable: CUDAAllocatorConfig::instance() reads PYTORCH_CUDA_ALLOC_CONF
    when it is set (also when empty), else PYTORCH_ALLOC_CONF; the other one is
    not read for the CUDA keys (the device-generic config reads them the other way
    round, but does not hold the pinned keys);
  - tokens: ',', ':', '[' and ']' are tokens of their own; whitespace is dropped,
    also inside a word ("Tr ue" is "True");
  - each entry is a key, one token that PyTorch does not check (meant to be ':'),
    then the value: one token, or for keys other than the pinned ones a bracketed
    list; then one token PyTorch does not check (meant to be ',') if any is left;
  - pinned_use_cuda_host_register (or pinned_use_hip_host_register, also accepted
    on CUDA builds) takes exactly "True" or "False": "true", "1", "yes" make
    PyTorch raise ValueError at its first pinned or device allocation; a later
    entry overrides an earlier one;
  - a key with no value (the text ends) or a list without ']' makes PyTorch raise.
PyTorch also refuses keys it does not know and bad values of its other keys; those
checks change from release to release and are not restated here (a user whose
setting PyTorch refuses sees PyTorch's own error at the first CUDA allocation).
"""

from __future__ import annotations

from collections.abc import Mapping

# The variables in the order PyTorch's CUDA allocator config looks for them.
ALLOC_CONF_VARIABLES = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
PINNED_REGISTER_KEYS = ("pinned_use_cuda_host_register", "pinned_use_hip_host_register")
# Meaningful only while pinned memory is registered: dropped with the key in the fix.
REGISTER_ONLY_KEYS = PINNED_REGISTER_KEYS + ("pinned_num_register_threads",)
_SPECIAL = ",:[]"
_SPACE = " \t\n\v\f\r"  # C's isspace in the "C" locale


def alloc_conf_variable(environ: Mapping[str, str]) -> tuple[str, str] | None:
    """(name, text) of the variable PyTorch's CUDA allocator reads, or None when
    neither is set."""
    for name in ALLOC_CONF_VARIABLES:
        if name in environ:
            return name, environ[name]
    return None


def alloc_conf_tokens(text: str) -> list[str]:
    """ConfigTokenizer's tokens: "a:1, b:[x,y]" -> ["a", ":", "1", ",", "b", ":", "[", "x", ",", "y", "]"]."""
    tokens, word = [], []
    for ch in text:
        if ch in _SPECIAL:
            if word:
                tokens.append("".join(word))
                word = []
            tokens.append(ch)
        elif ch not in _SPACE:
            word.append(ch)
    if word:
        tokens.append("".join(word))
    return tokens


def alloc_conf_entries(text: str) -> list[tuple[str, list[str]]]:
    """[(key, the entry's tokens from the key to its value's last token)] in order,
    walked as parseArgs walks them. Raises ValueError, quoting the text, where
    PyTorch raises for the text's shape: a key without a value, a list without
    ']', a pinned_use_*_host_register value other than True or False."""
    tokens = alloc_conf_tokens(text)
    entries, i = [], 0
    while i < len(tokens):
        key, start = tokens[i], i
        i += 2  # the key, then a token PyTorch skips unchecked
        if i >= len(tokens):
            raise ValueError(f"allocator settings {text!r}: {key!r} has no value")
        if key in PINNED_REGISTER_KEYS:
            if tokens[i] not in ("True", "False"):
                raise ValueError(f"allocator settings {text!r}: {key} takes True or False "
                                 f"(exactly so), not {tokens[i]!r}")
        elif tokens[i] == "[":
            while i < len(tokens) and tokens[i] != "]":
                i += 1
            if i >= len(tokens):
                raise ValueError(f"allocator settings {text!r}: the list of {key!r} has no ']'")
        entries.append((key, tokens[start:i + 1]))
        i += 2  # the value, then a separator PyTorch skips unchecked
    return entries


def pinned_use_host_register(text: str) -> bool:
    """Whether PyTorch pins by cudaHostRegister under these settings (False when the
    key is absent: cudaHostAlloc, PyTorch's default). Raises ValueError as
    alloc_conf_entries does, where PyTorch refuses the text."""
    value = False
    for key, entry in alloc_conf_entries(text):
        if key in PINNED_REGISTER_KEYS:
            value = entry[-1] == "True"
    return value


def alloc_conf_without(text: str, keys=REGISTER_ONLY_KEYS) -> str:
    """The settings with the entries of `keys` left out, written back with ',' and
    ':' ("expandable_segments:True,pinned_use_cuda_host_register:True" ->
    "expandable_segments:True"); "" when nothing is left. Raises as
    alloc_conf_entries does."""
    kept = []
    for key, entry in alloc_conf_entries(text):
        if key not in keys:
            kept.append(key + ":" + "".join(entry[2:]))
    return ",".join(kept)
