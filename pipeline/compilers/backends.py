"""The one table of backends: which compilers (and the runtimes of their artifacts) a target's
ABIs may name, in the order coverage and the manifest list them. Nothing else lists them.

A new backend is one module beside these (its `Backend`, backend.py), one row here, and its
ABI schema (a document in pipeline/spec/, in spec/target.py's `Abi` union).

A backend's module is imported when one of its answers is first asked for (importlib), not when
this table is: a stage that imports the table does not import every backend, and its steps' code
digests (core/codehash.py, which reads `LAZY` from this file's text) hold the backends their
configs name, not all of them. A step that asks for a backend its key does not hold is refused
(codehash.check_covered): the key can never be narrower than the code that runs.
"""
from __future__ import annotations

import importlib
from collections.abc import Mapping
from functools import lru_cache

from ..core import codehash
from .backend import Backend

# name (an ABI's `compiler:`), the manifest's `format` of its artifacts, "module:object" of its
# Backend. One row a backend.
LAZY = (
    ("iree", "iree-vmfb", "pipeline.compilers.iree_backend:IREE"),
    ("tvm", "tvm-so", "pipeline.compilers.tvm_backend:TVM"),
    ("rknn", "rknn", "pipeline.compilers.rknn_backend:RKNN"),
)
NAMES = tuple(row[0] for row in LAZY)


@lru_cache(maxsize=None)
def _import(row: tuple) -> Backend:
    module, _, attr = row[2].partition(":")
    backend = getattr(importlib.import_module(module), attr)
    if (backend.name, backend.format) != row[:2]:
        raise RuntimeError(f"compilers/backends.py: the row {row} names {backend.name!r} / "
                           f"{backend.format!r} of {row[2]}")  # a bug of the table, not user error
    return backend


def _load(row: tuple) -> Backend:
    codehash.check_covered(row[2], f"the {row[0]} backend")
    return _import(row)


class _Table(Mapping):
    """name (or format) -> Backend, importing a backend's module when it is first looked up:
    `in`, len() and the keys ask nothing of the modules."""

    def __init__(self, column: int):
        self._rows = {row[column]: row for row in LAZY}

    def __getitem__(self, key: str) -> Backend:
        return _load(self._rows[key])

    def __contains__(self, key) -> bool:
        return key in self._rows

    def __iter__(self):
        return iter(self._rows)

    def __len__(self) -> int:
        return len(self._rows)


BY_NAME: Mapping[str, Backend] = _Table(0)
BY_FORMAT: Mapping[str, Backend] = _Table(1)


def __getattr__(name: str):
    """`BACKENDS`: every backend, in the table's order (imports them all)."""
    if name == "BACKENDS":
        return tuple(BY_NAME[n] for n in NAMES)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def backend_of(abi) -> Backend:
    """The backend that builds a target's ABI (its `compiler:`)."""
    return BY_NAME[abi.compiler]


def backend_named(name: str) -> Backend:
    return BY_NAME[name]


def backend_for(artifact: dict) -> Backend:
    """The backend of a manifest's artifact entry (its `format`)."""
    return BY_FORMAT[artifact["format"]]
