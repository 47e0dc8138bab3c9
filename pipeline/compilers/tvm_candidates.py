"""How a MetaSchedule candidate is built for the tuning: only the CPU tensor intrinsics, the
build, the export of a library. Module-level functions: MetaSchedule's builder processes and a
Dask worker import them by name (compilers/tvm_tuner.py, compilers/tvm_cluster_builds.py).
"""
from __future__ import annotations

import importlib
import os
import sys
import tempfile
import types
from pathlib import Path

import tvm.s_tir
from tvm.driver import build
from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock
from tvm.support import cc

# None of the imports above loads tvm.s_tir.tensor_intrin (checked on apache-tvm 0.27): the
# stand-in below still takes its place.


def cpu_tensor_intrinsics() -> None:
    """Register only the CPU tensor intrinsics (x86, Arm, RISC-V).

    MetaSchedule's TuneContext and its default builder import `tvm.s_tir.tensor_intrin`, which
    parses every intrinsic TVM has: measured here, 85 s on 2 cores, 60 s of it CUDA's, 12 s
    ROCm's. MetaSchedule's builder re-creates its worker processes for every batch, so each
    batch paid that again (a 4-candidate batch of a tiny conv took ~4 minutes). LLVM CPU
    targets only use the CPU ones: the package is stood in for by a module that loads just those.
    """
    name = "tvm.s_tir.tensor_intrin"
    if name in sys.modules:
        return
    package = types.ModuleType(name, "CPU tensor intrinsics only (pipeline.compilers.tvm_candidates)")
    package.__path__ = [str(Path(tvm.s_tir.__file__).parent / "tensor_intrin")]
    sys.modules[name] = package
    for sub in ("x86", "arm_cpu", "riscv_cpu"):
        setattr(package, sub, importlib.import_module(f"{name}.{sub}"))


def build_candidate(mod, target, _params):
    """MetaSchedule's default_build without its import of every tensor intrinsic (see above);
    module-level so that the builder's worker processes can import it."""
    cpu_tensor_intrinsics()
    return build(RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod), target=target)


def export_aarch64(mod) -> str:
    """The builder's export for aarch64 candidates: a .so a board's runtime loads (module-level
    so that MetaSchedule's builder processes can import it)."""
    path = os.path.join(tempfile.mkdtemp(prefix="modelyard-tune-"), "candidate.so")
    mod.export_library(path, fcompile=cc.cross_compiler("aarch64-linux-gnu-g++"))
    return path


def export_host(mod) -> str:
    """A cluster worker's export of a host candidate: a .so linked there (g++), which this
    machine's runner loads as it is (LocalBuilder's default, a .tar, is linked by the runner)."""
    path = os.path.join(tempfile.mkdtemp(prefix="modelyard-tune-"), "candidate.so")
    mod.export_library(path)
    return path
