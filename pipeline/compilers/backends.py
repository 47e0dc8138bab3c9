"""The one table of backends: which compilers (and the runtimes of their artifacts) a target's
ABIs may name, in the order coverage and the manifest list them. Nothing else lists them.

A new backend is one module beside these (its `Backend`, backend.py), one row here, and its
ABI schema (a document in pipeline/spec/, in spec/target.py's `Abi` union).
"""
from __future__ import annotations

from .backend import Backend
from .iree_backend import IREE
from .rknn_backend import RKNN
from .tvm_backend import TVM

BACKENDS: tuple[Backend, ...] = (
    IREE,
    TVM,
    RKNN,
)
BY_NAME = {b.name: b for b in BACKENDS}
BY_FORMAT = {b.format: b for b in BACKENDS}


def backend_of(abi) -> Backend:
    """The backend that builds a target's ABI (its `compiler:`)."""
    return BY_NAME[abi.compiler]


def backend_named(name: str) -> Backend:
    return BY_NAME[name]


def backend_for(artifact: dict) -> Backend:
    """The backend of a manifest's artifact entry (its `format`)."""
    return BY_FORMAT[artifact["format"]]
