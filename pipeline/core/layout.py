"""The only code that knows where artifacts live.

    artifacts/
      models/<model>/<stage>/          target-independent steps: import, golden, static
      <target>/<model>/<abi>/<stage>/  per-target steps: iree_compile, tvm_tune, tvm_compile, validate
      <target>/<model>/<stage>/        per target and model: coverage, choose
      <target>/manifest.json           what ships for the target, each file with its sha256
      releases/<target>/<version>/     signed, immutable release bundles (see release.py)
      packages/<target>/<version>/     Debian packages cut from a release, signed list (deb.py)
      <target>/<model>/<abi>/bench/<sha256>.json   `doit bench` result for that artifact (measured,
                                       not built: rewritten on every bench run)
      <target>/bench.json, report.html the last bench run of the target: summary and report
      logs/<stage>/<step>.log          the tools' own output, kept for diagnosis
      reports/accuracy/<model>.<variant>/  the report of a failed accuracy gate (the step's own
                                       outputs are removed on failure; see accuracy.py)
      reports/bisect/<target>/<model>/<abi>/  `doit bisect`: the first wrong node and its repro
      tuning/<target>/<abi>/<tvm version>/  the shared MetaSchedule database `doit tune` appends
                                       to, every model of the ABI (see tvm_tune.py)
      <target>/<model>/<abi>/tuning_curve.json  `doit tune curve=1`: trials vs latency (measured)
      reports/profile/<target>/<model>/profile.json  `doit profile`: time per dispatch / kernel /
                                       onnxruntime node, mapped to ONNX ops (measured, not built)
      .store/                          content-addressed step outputs (see store.py)
      .tmp/<pid>/<stage>/<step>/       scratch of a running step, per process (see lock.py)
      .lock                            the workspace lock a build holds (see lock.py)
      .cache/                          hash memo, model signatures, Mesa's shader cache
                                       (mesa-shaders/: lavapipe's compiled kernels; safe to delete)
      .doit.db                         doit's own state (safe to delete)
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Layout:
    root: Path  # the artifacts folder

    @classmethod
    def of_manifest(cls, manifest: Path) -> "Layout":
        """The layout a target's manifest.json lives in (its paths are relative to the root)."""
        return cls(Path(manifest).parent.parent)

    def target_dir(self, target: str) -> Path:
        """Per target: its manifest and its last bench run."""
        return self.root / target

    def model_stage(self, model: str, stage: str) -> Path:
        return self.root / "models" / model / stage

    def target_model_stage(self, target: str, model: str, stage: str) -> Path:
        """Per target and model, whatever the ABI: coverage, choose."""
        return self.target_dir(target) / model / stage

    def artifact_stage(self, target: str, model: str, abi: str, stage: str) -> Path:
        return self.target_dir(target) / model / abi / stage

    def manifest(self, target: str) -> Path:
        return self.target_dir(target) / "manifest.json"

    def runtime(self, arch: str) -> Path:
        """The board-side C runtime built for one architecture (stage `runtime`)."""
        return self.root / "runtime" / arch

    def release(self, target: str, version: str) -> Path:
        return self.root / "releases" / target / version

    def packages(self, target: str, version: str) -> Path:
        """Debian packages of a release (`doit release format=deb`, release/deb.py)."""
        return self.root / "packages" / target / version

    def scratch(self, stage: str, name: str) -> Path:
        """Where a stage writes before publishing by rename (same file system as its outputs);
        one folder per process, so that two processes never share one (see lock.py)."""
        return self.root / ".tmp" / str(os.getpid()) / stage / name.replace("/", "__")

    @property
    def lock(self) -> Path:
        return self.root / ".lock"

    def bench_result(self, target: str, model: str, abi: str, sha256: str) -> Path:
        return self.target_dir(target) / model / abi / "bench" / f"{sha256}.json"

    def bench_summary(self, target: str) -> Path:
        return self.target_dir(target) / "bench.json"

    def bench_report(self, target: str) -> Path:
        return self.target_dir(target) / "report.html"

    def accuracy_report(self, variant: str) -> Path:
        return self.root / "reports" / "accuracy" / variant

    def bisect_report(self, target: str, model: str, abi: str) -> Path:
        """`doit bisect`: the first wrong node of a build, its standalone repro, the probes."""
        return self.root / "reports" / "bisect" / target / model / abi

    def profile_report(self, target: str, model: str) -> Path:
        """`doit profile`: where a model's artifacts and onnxruntime spend their time, per op."""
        return self.root / "reports" / "profile" / target / model

    def tuning_database(self, target: str, abi: str, tvm_version: str) -> Path:
        """The shared MetaSchedule database of a TVM ABI: every model's tuning reads and appends."""
        return self.root / "tuning" / target / abi / tvm_version

    def tuning_curve(self, target: str, model: str, abi: str) -> Path:
        return self.target_dir(target) / model / abi / "tuning_curve.json"

    def log(self, stage: str, step: str) -> Path:
        return self.root / "logs" / stage / f"{step.replace('/', '_').replace('@', '_')}.log"

    @property
    def store(self) -> Path:
        return self.root / ".store"

    @property
    def cache(self) -> Path:
        return self.root / ".cache"

    @property
    def shader_cache(self) -> Path:
        """Mesa's on-disk shader cache for Vulkan validation on lavapipe (keep it in CI), or the
        folder $MODELYARD_SHADER_CACHE names (one cache for several workspaces: Mesa keys each
        entry by shader and driver build, so sharing it is safe)."""
        shared = os.environ.get("MODELYARD_SHADER_CACHE")
        return Path(shared) if shared else self.cache / "mesa-shaders"

    @property
    def doit_db(self) -> Path:
        return self.root / ".doit.db"

    def relative(self, path: Path) -> str:
        """A path as written in manifests: relative to the artifacts folder, never absolute."""
        return Path(path).resolve().relative_to(self.root.resolve()).as_posix()

    def resolve(self, relative: str) -> Path:
        """A path as written in manifests (see `relative`), as a file here."""
        return self.root / relative


# ----------------------------------------------------------------------------- steps' files
# The files of a model's steps that later stages read, as functions of the layout and a spec
# (its name, inputs and signature): a stage asks here rather than importing the stage that wrote
# them, so that its code digest does not take in that stage's code.
def static_model(layout: Layout, model) -> Path:
    """The static stage's model: what every compiler gets."""
    return layout.model_stage(model.name, "static") / "model.onnx"


def outputs_for(n_inputs: int, n_outputs: int) -> tuple[str, ...]:
    """The golden step's files: golden.json, input_<i>.npy, output_<k>.npy."""
    return (("golden.json",) + tuple(f"input_{i}.npy" for i in range(n_inputs))
            + tuple(f"output_{k}.npy" for k in range(n_outputs)))


def golden_files(layout: Layout, model) -> dict:
    """The golden step's files as a step's inputs: golden.json and golden:<file>."""
    folder = layout.model_stage(model.name, "golden")
    n_out = len(model.signature["outputs"])
    files = {"golden.json": folder / "golden.json"}
    for name in outputs_for(len(model.inputs), n_out)[1:]:
        files[f"golden:{name}"] = folder / name
    return files


def read_golden(ctx):
    """(golden doc, input arrays, output arrays) from a step whose inputs include golden_files."""
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    doc = json.loads(ctx.input("golden.json").read_text())
    ins = [np.load(ctx.input(f"golden:{e['file']}"), allow_pickle=False) for e in doc["inputs"]]
    outs = [np.load(ctx.input(f"golden:{e['file']}"), allow_pickle=False) for e in doc["outputs"]]
    return doc, ins, outs


def coverage_file(layout: Layout, target_name: str, model_name: str) -> Path:
    """The coverage step's verdicts for a model on a target."""
    return layout.target_model_stage(target_name, model_name, "coverage") / "coverage.json"
