"""What a backend is: one compiler and the runtime of its artifacts, answering every question the
stages, the runners and the commands ask about it. One module per backend (iree_backend.py,
tvm_backend.py, rknn_backend.py) exports one `Backend`; the table of them is backends.py (`BACKENDS`, shown beside
the stages by pipeline/graph). Callers ask the object (`backend_of(abi).format`); no code outside
a backend's own module compares its name (tests/unit/test_architecture.py checks it).

A backend's compile stage (pipeline/stages/<compile_stage>.py) writes, per ABI, the artifact and
a compile.json holding at least `entry` (the entry point the manifest records); its own fields
reach the manifest through `compile_fields` and `requires`. What a new backend is, shown:
tests/e2e/test_fourth_backend.py (tests/fixtures/fourth_backend/).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ENTRY = "main"  # the compiled entry point of every artifact: the static stage names its graph so


@dataclass(frozen=True)
class Backend:
    name: str                   # the `compiler:` its ABIs give in a target YAML
    format: str                 # the manifest's `format` of its artifacts
    artifact: str               # the artifact's file name in its compile step's folder
    compile_stage: str          # the stage that makes the artifact: pipeline/stages/<compile_stage>.py
    tune_stage: str | None      # a stage before it that tunes, when a model has a budget
    # graph/stages.py makes a row of STAGES of each (tune first): (stage name, `doit list`'s line)
    stage_docs: tuple
    made_by: str                # the distribution whose compiler makes its artifacts (the SBOM)
    abi_schema: tuple           # the spec documents of its ABIs (in spec/target.py's `Abi` union)
    variants: bool              # builds precision variants (int8, fp16) of a model
    configs: bool               # its ABIs declare `configs:` that `doit search` builds and times
    # The manifest: (compile.json, the compile step's tool versions) -> the artifact entry's
    # `compile` fields besides step_key and tools, and its `requires`.
    compile_fields: Callable[[dict], dict]
    requires: Callable[[dict, dict], dict]
    # Validation: how the artifact runs here (the `validate` stage).
    #   runner(run, entry, artifact, inputs, outputs, where, shader_cache) -> (argv, executed, env)
    runner: Callable
    validation_tools: Callable[[dict], tuple]   # the ABI's run -> the tools its key names
    what: str                   # how validation names the artifact it runs
    run_hint: str               # the hint when the run fails
    wrong_hint: str             # the hint when the outputs are wrong
    # Timing on this machine (choose's fastest-on-host, `doit search`, `doit bench`):
    #   timer(artifact, entry, device, threads) -> a run/timing.py runner
    timer: Callable[[Path, str, str, int], object]
    runner_key: Callable[[str], str]   # the device an artifact was validated on -> bench's RUNNERS key
    app: object                 # the app-side loader of its artifacts: why_not / choice / load (see pipeline/app/)
    # Optional answers (the defaults fit IREE and TVM):
    #   validation_tolerance(abi, precision) -> (the tolerance vs golden, where it is declared),
    #   or None: the model's or variant's own; validation_inputs(compiled folder, outputs) -> more
    #   files the validate step reads from the compile step; variant_skip(abi, variant) -> why
    #   the backend does not build that precision variant (None: it does).
    validation_tolerance: Callable = lambda abi, precision: None
    validation_inputs: Callable[[Path, int], dict] = lambda compiled, n_outputs: {}
    variant_skip: Callable = lambda abi, variant: None
    timeable: bool = True       # its artifacts can be timed on this machine (bench, search, choose)
    vias: tuple = ("python", "qemu")   # the `run.via`s its ABIs may give (validate's runners)
    # The coverage step's basis for it when it has no op table there (stages/coverage.py): its
    # own build is then the check.
    coverage_basis: str = "no op table: the backend's own build is the check"
    # A release's `requires` of an artifact (a manifest entry): the runtime the board needs.
    release_runtime: Callable[[dict], dict] = lambda art: {}

    def builds(self, abi) -> bool:
        """Whether this backend builds the ABI (the ABI's `compiler:` names it)."""
        return abi.compiler == self.name

    @property
    def title(self) -> str:
        """How messages name it: IREE, TVM."""
        return self.name.upper()
