"""What TVM's stages share: a MetaSchedule budget (a key part of tvm_tune and tvm_compile) and
the ONNX import into Relax (tvm_compile's child, tvm_tune's child, coverage's confirming child).

Kept here, below the stages, so that no stage imports another: each stage's code digest covers
only this, not its sibling. The TVM import itself runs only in a child process.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..core.steps import StageConfig


@dataclass(frozen=True)
class Budget(StageConfig):
    """A MetaSchedule budget: trials in all, at most per_task on any one task."""
    trials: int
    per_task: int

    def problems(self):
        for name in ("trials", "per_task"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                yield f"{name} must be a positive integer, got {value!r}"


def import_onnx(path: Path):
    """The static ONNX model as a Relax module (shapes and dtypes from the model itself)."""
    import onnx  # onnx: 1.5 s, not needed by doit list
    from tvm.relax.frontend.onnx import from_onnx  # tvm: 2.8 s, not needed by doit list
    return from_onnx(onnx.load(str(path)))
