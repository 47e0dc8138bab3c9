"""The one table of stages: which steps exist, in which order. Nothing else lists them.

    import ─┬─> golden ─> static ─> coverage ─> iree_compile (per target ABI) ─> validate ─┬─> choose ─> manifest
            └────────────────^                  └─> [tvm_tune ─>] tvm_compile ─> validate ─┘   (per target)
    precision variants: static ─> quantize ─> accuracy (the gate) ─> golden ─> iree_compile ─> validate ─> manifest
    shape variants are models of their own that share their model's import.
    search_configs (after coverage, per model without a pin and host IREE ABI): ranks its configs
    in a budget; iree_compile of that ABI (and of those that follow it) reads the ranking.
    runtime (per architecture): the C runtime that loads the artifacts on the board; `doit release` needs it.

Every stage module (pipeline/stages/<module>.py) has the same small interface:
    steps(project) -> list[Step]   the steps of that stage for the loaded models and targets
    run(ctx)                       what one step does (the Step carries it as its action)
    VERSION, OUTPUTS               part of the step key; the files it writes
A stage marked `after_coverage` reads the coverage step's verdicts to decide which ABIs a model
is built for: dodo.py creates its tasks once the `coverage` tasks have run.

BACKENDS (pipeline/compilers/backends.py) are the compilers a target's ABIs name: each makes its
artifacts in its own stages (`compile_stage`, `tune_stage`, pipeline/stages/<name>.py), which
STAGES takes from the backend's row (backend_stages), so a new backend adds no row here; the
stages they share (coverage, validate, choose, manifest) ask the backend.

A slot's fallback compiler (compilers/builds.py `fallback_pair`): the preferred candidate's and
the fallback's compile and validate steps are gated (graph/fallback.py, applied in Stage.steps):
the fallback builds only when the preferred fails to compile or validate; choose and manifest
read their attempt records.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

from ..compilers.backends import BACKENDS
from .fallback import gate as gate_fallbacks
from ..stages import (accuracy, choose, coverage, golden, import_model, manifest, quantize, runtime,
                      search_configs, static, validate)


@dataclass(frozen=True)
class Stage:
    name: str                # the doit task name
    module: ModuleType       # steps(project), run(ctx), VERSION, OUTPUTS
    doc: str                 # one line, shown by `doit list`
    after_coverage: bool = False
    in_build: bool = True    # part of `doit build` (and of the no-op snapshot); else only of the
                             # commands that need it (`runtime`: `doit release`)

    def steps(self, project) -> list:
        """The stage's steps for the project (Project.steps), a slot's fallback pair gated."""
        return gate_fallbacks(project, self.module.steps(project))


def backend_stages() -> list[Stage]:
    """The stages of each backend, in the table's order (its tune stage before its compile
    stage): pipeline/stages/<name>.py each, after coverage, named by the backend's row."""
    return [Stage(name, importlib.import_module(f"..stages.{name}", __package__),
                  dict(b.stage_docs)[name], after_coverage=True)
            for b in BACKENDS for name in (b.tune_stage, b.compile_stage) if name]


STAGES = (
    Stage("import", import_model, "check the source model (onnx.checker) and normalise its opset"),
    Stage("golden", golden, "onnxruntime CPU outputs on each model's fixed test inputs"),
    Stage("static", static, "bind every dynamic dim, simplify with onnxsim, compare with golden"),
    Stage("quantize", quantize, "precision variants: int8 (QDQ, calibrated) or fp16 models from the static model"),
    Stage("accuracy", accuracy, "precision variants' gates vs fp32 (`doit accuracy` prints them)"),
    Stage("coverage", coverage, "which ops of each model each compiler of the target cannot take"),
    Stage("search_configs", search_configs, "no pin: rank each host IREE ABI's configs for the model "
          "within search=SECONDS (default 180; 0: none)", after_coverage=True),
    *backend_stages(),
    Stage("validate", validate, "run each artifact (natively or under qemu-user) and compare with golden", True),
    Stage("choose", choose, "which compiler's artifact ships per slot of the target", True),
    Stage("manifest", manifest, "write artifacts/<target>/manifest.json listing each artifact with its sha256", True),
    Stage("runtime", runtime, "cross-build the board-side C runtime (runtime/) per architecture the targets ship",
          in_build=False),
)
BY_NAME = {s.name: s for s in STAGES}
