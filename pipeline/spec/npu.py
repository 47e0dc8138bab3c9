"""The NPU section of a target: a `compiler: rknn` ABI, built by Rockchip's RKNN-Toolkit2 into a
`.rknn` file and validated in the toolkit's simulator (pipeline/compilers/rknn_backend.py,
docs/npu.md):

    npu:
      compiler: rknn
      target_platform: rk3588        # RKNN's target_platform (rk3588, rk3576, rk3568, ...)
      precision: fp16                # the model's own build (int8: the model's int8 variants)
      tolerance:                     # vs golden, per precision of the .rknn (an fp16 NPU build
        fp16: {max_abs: 0.01, ...}   # cannot meet an fp32 model's 1e-5)
        int8: {max_abs: 0.3, ...}
      run: {via: simulator}          # the only way to run it here: the toolkit's x86_64 simulator
      runtime: {librknnrt: 2.5.0}    # the board-side runtime library an artifact needs
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import Field

from .common import Doc, ToleranceDoc

PLATFORMS = ("rk3588", "rk3576", "rk3568", "rk3566", "rk3562", "rv1103", "rv1106", "rk2118")
NPU_PRECISIONS = ("fp16", "int8")


@dataclass(frozen=True)
class NpuAbi:
    """One RKNN build of a model for a target's NPU, and how it is validated here."""
    name: str
    target_platform: str
    precision: str                  # the model's own build: fp16 (int8 for int8 variants)
    tolerance: dict                 # precision -> tolerance dict (numerics.compare) vs golden
    run: dict                       # {"via": "simulator"}
    librknnrt: str                  # the board runtime library version its artifacts need
    compiler: str = "rknn"
    backend: str = "npu"
    flags: tuple = ()
    configs: tuple = ()             # an NPU ABI has no `configs:`
    configs_from: str | None = None
    arch: str | None = None         # no CPU architecture: the C runtime builds none for it

    def compile_config(self) -> dict:
        return {"compiler": self.compiler, "backend": self.backend,
                "target_platform": self.target_platform}


class NpuToleranceDoc(Doc):
    """The NPU build's outputs against golden, per precision of the `.rknn`."""
    fp16: ToleranceDoc
    """the model's own (fp16) build, against the fp32 golden outputs"""
    int8: ToleranceDoc
    """an int8 variant's build, against the variant's own golden (onnxruntime's QDQ graph: RKNN
    quantizes with its own calibration of the same samples, so it differs more)"""


class NpuRunDoc(Doc):
    """How the artifact is validated here."""
    via: Literal["simulator"]
    """simulator: RKNN-Toolkit2's x86_64 simulator, on the model built in the same process"""


class NpuRuntimeDoc(Doc):
    """What the board needs to load the artifacts."""
    librknnrt: Annotated[str, Field(pattern=r"^[0-9]+\.[0-9]+\.[0-9]+$")]
    """the librknnrt.so version (Rockchip's board runtime; rknn-toolkit-lite2 for Python)"""


class NpuAbiDoc(Doc):
    """An ABI built by RKNN-Toolkit2 for a Rockchip NPU (a `.rknn` file)."""
    compiler: Literal["rknn"]
    target_platform: Literal[PLATFORMS]
    precision: Literal["fp16"] = "fp16"
    """the model's own build (the model's int8 variants are built int8)"""
    tolerance: NpuToleranceDoc
    run: NpuRunDoc
    runtime: NpuRuntimeDoc


def parse_abi(name: str, doc: NpuAbiDoc, where: str, problems: list) -> NpuAbi | None:
    """A `compiler: rknn` ABI of a target YAML; problems are appended, one sentence each."""
    if None in (doc.target_platform, doc.tolerance, doc.run, doc.runtime):
        return None  # reported by the document's check
    tolerance = {p: getattr(doc.tolerance, p).spec().as_dict() for p in NPU_PRECISIONS}
    return NpuAbi(name=name, target_platform=doc.target_platform, precision=doc.precision,
                  tolerance=tolerance, run={"via": doc.run.via}, librknnrt=doc.runtime.librknnrt)


class NpuModelDoc(Doc):
    """A model's own settings for its NPU builds (model.yaml `npu:`)."""
    budget_s: Annotated[int, Field(ge=1)] = None
    """the most seconds one RKNN-Toolkit2 build of this model may take, instead of the budget
    derived from the model's size and node count (rknn_compile.budget); past it the toolkit is
    killed and the step fails"""
