"""The one walk of nested containers (a batch, a state_dict): ``map_leaves``
rebuilds a structure with each leaf replaced, the way PyTorch's ``pin_memory``
rebuilds a batch.

Containers: a mapping's clone (``copy.copy``, so a subclass keeps its type and
attributes: a state_dict's ``_metadata``, a defaultdict's factory) with its
values replaced; a named tuple or tuple of the same type; a list's clone with
its items replaced. str and bytes are leaves. A mapping or sequence whose type
cannot be rebuilt (TypeError) comes back as a dict or list, as in PyTorch.

Which types count as containers is the caller's: ``any_container=True`` (the
DataLoader: any ``collections.abc`` Mapping and Sequence, as PyTorch walks a
batch) or False (``to_device``/``to_host``: dict, list and tuple, and their
subclasses; any other object, a ``range`` or a custom sequence, passes as it is).
"""

from __future__ import annotations

import collections.abc
import copy

_ABC = (collections.abc.Mapping, collections.abc.MutableMapping, collections.abc.Sequence,
        collections.abc.MutableSequence)
_BUILTIN = (dict, dict, list, list)


def map_leaves(data, fn, is_leaf, any_container: bool = True):
    """data with each x for which is_leaf(x) replaced by fn(x) (called in
    depth-first order), containers rebuilt (see the module's text)."""
    return _map(data, fn, is_leaf, _ABC if any_container else _BUILTIN)


def _map(data, fn, is_leaf, kinds):
    if is_leaf(data):
        return fn(data)
    if isinstance(data, (str, bytes)):
        return data
    mapping, mutable_mapping, sequence, mutable_sequence = kinds
    if isinstance(data, mapping):
        values = {k: _map(v, fn, is_leaf, kinds) for k, v in data.items()}
        try:
            if isinstance(data, mutable_mapping):
                clone = copy.copy(data)  # keeps the type's attributes; then its values are replaced
                clone.update(values)
                return clone
            return type(data)(values)
        except TypeError:
            return values
    if isinstance(data, tuple):
        items = [_map(v, fn, is_leaf, kinds) for v in data]
        if hasattr(data, "_fields"):  # a named tuple
            return type(data)(*items)
        return type(data)(items)
    if isinstance(data, sequence):
        items = [_map(v, fn, is_leaf, kinds) for v in data]
        try:
            if isinstance(data, mutable_sequence):
                clone = copy.copy(data)
                for i, v in enumerate(items):
                    clone[i] = v
                return clone
            return type(data)(items)
        except TypeError:
            return items
    return data


def leaves_of(data, is_leaf, any_container: bool = True) -> list:
    """The leaves of data in map_leaves' order (no structure is rebuilt)."""
    found: list = []
    _collect(data, is_leaf, _ABC if any_container else _BUILTIN, found)
    return found


def _collect(data, is_leaf, kinds, found: list) -> None:
    if is_leaf(data):
        found.append(data)
    elif isinstance(data, (str, bytes)):
        return
    elif isinstance(data, kinds[0]):
        for v in data.values():
            _collect(v, is_leaf, kinds, found)
    elif isinstance(data, (tuple, kinds[2])):
        for v in data:
            _collect(v, is_leaf, kinds, found)
