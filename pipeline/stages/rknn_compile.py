"""Stage `rknn_compile`: static ONNX -> RKNN-Toolkit2 -> a `.rknn` for an NPU ABI (rk3588), and the
toolkit simulator's outputs on the golden inputs, made in one child process.

    static ONNX (fp32) --load_onnx/build(fp16 | int8 on the variant's calibration samples)-->
      in-process RKNN model --export_rknn--> model.rknn
                            --init_runtime(simulator)/inference(golden inputs)--> simulated_<k>.npy

The toolkit lives in its own venv (.tools/rknn-venv, setup.sh) and runs as a child through
pipeline/run/rknn_driver.py, which imports nothing of this package. One process for all three
because the simulator runs only a model built in that process (docs/npu.md); the validate step
then compares the simulated outputs with golden (pipeline/run/rknn_run.py checks that they are
those of the shipped bytes' model and of the golden inputs).

The model's own build is fp16 (RKNN's default for float models); a model's int8 variant is built
from the same fp32 static model, quantized by RKNN with the variant's own calibration samples
(RKNN's quantizer, not onnxruntime's QDQ graph: the NPU's int8 kernels need RKNN's scheme).

Reproducible bytes: the toolkit writes host addresses and uninitialised memory into the file.
The child runs with address-space randomisation off (setarch -R), malloc's fill byte fixed
(MALLOC_PERTURB_), hash seed 0, an empty fixed environment, and every path the same length
(a private /tmp/rknn-XXXXXXXX holding a link to the venv, the driver and the inputs under fixed
names): the same inputs then give the same bytes wherever the repository lives
(tests/e2e/test_npu.py rebuilds and compares). int8 builds can still differ in a few
address-like bytes (ppocr_cls.int8: 10 bytes in two fields): an int8 step builds twice and
compile.json lists the byte ranges that differed (`reproducibility.rebuilt_in_this_step`).
"""
from __future__ import annotations

import dataclasses
import json
import platform
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..compilers.rknn_backend import RKNN, simulated_output
from ..core.steps import StageConfig, Step
from ..core.store import canonical_json, pretty_json, sha256_file, sha256_text
from ..core.tools import describe_exit, rknn_toolkit, run_tool, tail
from ..spec.npu import NPU_PRECISIONS
from ..spec.variants import full_name
from .plan import (ENTRY, abi_step_name, built_abis, golden_files, static_model, variant_inputs,
                   variant_model, variant_preprocessing, variant_skip_reason, where)
from .quantize import Samples, load_data

VERSION = 1
TOOLS = ("rknn-toolkit2",)
DRIVER = Path(__file__).resolve().parents[1] / "run" / "rknn_driver.py"
# The child's whole environment (nothing of the caller's: its size moves the toolkit's addresses).
RECIPE = {"MALLOC_PERTURB_": "165", "PYTHONHASHSEED": "0", "LC_ALL": "C", "PATH": "/usr/bin:/bin",
          "OMP_NUM_THREADS": "1"}
ALGORITHMS = ("normal", "mmse", "kl_divergence")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def outputs_of(n_outputs: int) -> tuple[str, ...]:
    return (RKNN.artifact, "compile.json", *(simulated_output(k) for k in range(n_outputs)))


@dataclass(frozen=True)
class Config(StageConfig):
    """An NPU ABI's build of one model: the platform, the precision, the inputs it simulates."""
    compiler: str                       # rknn
    backend: str                        # npu
    target_platform: str                # RKNN's target_platform, e.g. rk3588
    precision: str                      # fp16 | int8
    entry: str
    librknnrt: str                      # the board runtime version the artifact is declared for
    inputs: tuple[dict, ...]            # per model input: name, shape, dtype
    n_outputs: int
    preprocessing: dict | None = None   # int8: input name -> Preprocessing (calibration samples)
    calibration: Samples | None = None  # int8: the variant's calibration samples
    algorithm: str | None = None        # int8: RKNN's quantized_algorithm

    def problems(self):
        if (self.compiler, self.backend) != (RKNN.name, "npu"):
            yield f"compiler and backend must be {RKNN.name} and npu, got {self.compiler!r}, {self.backend!r}"
        if self.precision not in NPU_PRECISIONS:
            yield f"precision must be one of {', '.join(NPU_PRECISIONS)}, got {self.precision!r}"
        if (self.precision == "int8") != (self.calibration is not None):
            yield "calibration samples are given for an int8 build, and only for it"
        if (self.precision == "int8") != (self.algorithm in ALGORITHMS):
            yield f"an int8 build names its algorithm ({', '.join(ALGORITHMS)}), an fp16 one none"
        if self.n_outputs < 1:
            yield "the model must have an output"

    @classmethod
    def from_key(cls, key: dict) -> "Config":
        return cls(**{**key, "calibration": key["calibration"] and Samples.from_key(key["calibration"])})


# ----------------------------------------------------------------------------- the stage
def driver_argv(cfg: Config, root: Path) -> list[str]:
    """The child's command line, all paths relative to its private root (pure: no toolchain)."""
    argv = ["setarch", platform.machine(), "-R", f"{root}/venv/bin/python", "driver.py",
            "--model", "model.onnx", "--out", RKNN.artifact, "--platform", cfg.target_platform,
            "--precision", cfg.precision]
    if cfg.precision == "int8":
        argv += ["--dataset", "dataset.txt", "--algorithm", cfg.algorithm]
    argv += [a for i in range(len(cfg.inputs)) for a in ("--input", f"input_{i}.npy")]
    argv += [a for k in range(cfg.n_outputs) for a in ("--sim-output", simulated_output(k))]
    return argv + ["--summary", "summary.json"]


_ROW = re.compile(r"^D RKNN: \[[^\]]*\] +(\d+) +(\S+) +(\S+) +(NPU|CPU|GPU) .* (\S+) *$")
_BOUNDARY = ("InputOperator", "OutputOperator")   # always "CPU" in the table: the tensors' hand-over


def _messages(output: str) -> dict:
    """What the toolkit said of this build: its warnings and errors (timestamps dropped), the
    ops of its layer table that run on the NPU's CPU fallback (op -> nodes), the layers per
    engine, and any op it says it does not support: the coverage facts the manifest lists."""
    lines = [_ANSI.sub("", l).rstrip() for l in output.splitlines()]
    said = [re.sub(r"\[\d\d:\d\d:\d\d\.\d+\] ", "", l.strip()) for l in lines
            if re.match(r"^[WE] ", l.strip())]
    engines: dict = {}
    fallbacks: dict = {}
    for l in lines:
        m = _ROW.match(l)
        if m is None or m.group(2) in _BOUNDARY:
            continue
        engines[m.group(4)] = engines.get(m.group(4), 0) + 1
        if m.group(4) == "CPU":
            fallbacks.setdefault(m.group(2), []).append(m.group(5))
    said = list(dict.fromkeys(said))  # once each, in the order first printed
    return {"warnings": [l for l in said if l.startswith("W ")],
            "errors": [l for l in said if l.startswith("E ")],
            "layers": dict(sorted(engines.items())),
            "cpu_fallbacks": [{"op": op, "count": len(nodes), "nodes": nodes}
                              for op, nodes in sorted(fallbacks.items())],
            "unsupported": [l for l in said if re.search(r"not support|unsupport", l, re.I)]}


def _stage_inputs(ctx, cfg: Config, root: Path) -> dict | None:
    """Copy the model and golden inputs into the child's root under fixed names; for int8 write
    the calibration samples as .npy files and the toolkit's dataset list. Returns what the
    calibration was (for compile.json)."""
    import numpy as np
    shutil.copyfile(ctx.input("model"), root / "model.onnx")
    for i in range(len(cfg.inputs)):
        shutil.copyfile(ctx.input(f"golden:input_{i}.npy"), root / f"input_{i}.npy")
    if cfg.precision != "int8":
        return None
    samples = load_data(ctx, "calibration", cfg.calibration)
    lines = []
    for s, feeds in enumerate(samples):
        names = []
        for i, spec in enumerate(cfg.inputs):
            name = f"calibration_{s}_{i}.npy"
            np.save(root / name, np.ascontiguousarray(feeds[spec["name"]]), allow_pickle=False)
            names.append(name)
        lines.append(" ".join(names))
    (root / "dataset.txt").write_text("\n".join(lines) + "\n")
    files = [[n, sha256_file(ctx.input(f"calibration:{n}"))] for n in cfg.calibration.files]
    return {"samples": len(samples), "kind": cfg.calibration.kind, "algorithm": cfg.algorithm,
            "quantized_dtype": "w8a8", "sha256": sha256_text(canonical_json(files))}


def _child(ctx, cfg: Config, tk, where: dict) -> tuple[Path, dict | None, dict, dict]:
    """One run of the driver in a fresh private root: (root, calibration, summary, messages).
    The caller removes the root; a failure removes it and raises the step's error."""
    # A private root whose path has the same length every time (mkdtemp: 8 random characters).
    root = Path(tempfile.mkdtemp(prefix="rknn-", dir="/tmp"))
    try:
        (root / "venv").symlink_to(tk.venv.resolve())
        shutil.copyfile(DRIVER, root / "driver.py")
        calibration = _stage_inputs(ctx, cfg, root)
        result = run_tool(driver_argv(cfg, root), log=ctx.log, what="RKNN-Toolkit2 build + simulator",
                          cwd=root, env={**RECIPE, "HOME": str(root)}, check=False, timeout=3600,
                          progress=f"{ctx.step.stage}:{ctx.step.name}", **where)
        messages = _messages(result.output)
        if result.returncode != 0:
            said = "\n".join("    " + l for l in messages["errors"][-10:]) or tail(result.output)
            raise ctx.error(f"RKNN-Toolkit2 {tk.version} failed for {cfg.target_platform} "
                            f"{cfg.precision} ({describe_exit(result.returncode)}):\n{said}",
                            log=True, hint="read the log (the toolkit's own messages); an op RKNN "
                            "cannot take: skip the NPU ABI for this model (`skip: {npu: <why>}`)")
        return root, calibration, json.loads((root / "summary.json").read_text()), messages
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise


def differing_ranges(a: bytes, b: bytes) -> list[list[int]]:
    """The byte ranges [start, end) where two files differ (a length difference: its tail)."""
    ranges: list[list[int]] = []
    for i in range(min(len(a), len(b))):
        if a[i] != b[i]:
            if ranges and ranges[-1][1] >= i - 8:   # one field: gaps of up to 8 equal bytes
                ranges[-1][1] = i + 1
            else:
                ranges.append([i, i + 1])
    if len(a) != len(b):
        ranges.append([min(len(a), len(b)), max(len(a), len(b))])
    return ranges


def run(ctx) -> None:
    cfg = ctx.cfg
    where = dict(stage=ctx.step.stage, **ctx.step.where)
    tk = rknn_toolkit(**where)
    root, calibration, summary, messages = _child(ctx, cfg, tk, where)
    try:
        shutil.copyfile(root / RKNN.artifact, ctx.output(RKNN.artifact))
        sim_outputs = []
        for k in range(cfg.n_outputs):
            shutil.copyfile(root / simulated_output(k), ctx.output(simulated_output(k)))
            sim_outputs.append({"file": simulated_output(k),
                                "sha256": sha256_file(ctx.output(simulated_output(k))),
                                **summary["outputs"][k]})
    finally:
        shutil.rmtree(root, ignore_errors=True)
    rebuilt = None
    if cfg.precision == "int8":  # int8 builds were seen to differ in a few bytes even with the
        again, *_ = _child(ctx, cfg, tk, where)  # recipe: build again, and say what differs
        try:
            a, b = ctx.output(RKNN.artifact).read_bytes(), (again / RKNN.artifact).read_bytes()
            same_sim = all(sha256_file(again / o["file"]) == o["sha256"] for o in sim_outputs)
        finally:
            shutil.rmtree(again, ignore_errors=True)
        ranges = differing_ranges(a, b)
        rebuilt = {"identical": not ranges, "differing_bytes": sum(e - s for s, e in ranges),
                   "ranges": ranges, "simulated_outputs_identical": same_sim}
    artifact = ctx.output(RKNN.artifact)
    report = {
        "compiler": RKNN.name, "target_platform": cfg.target_platform, "precision": cfg.precision,
        "entry": cfg.entry, "toolkit": f"rknn-toolkit2 {summary['toolkit']}",
        "librknnrt": cfg.librknnrt, "size": artifact.stat().st_size,
        "sha256": sha256_file(artifact),
        "messages": messages,
        "simulated": {
            "what": "the model the toolkit built in this step's process, run in its simulator on "
                    "the golden inputs, then exported as the shipped file (sha256 above): the "
                    "simulator cannot run a .rknn re-loaded from disk",
            "inputs": [{"file": f"input_{i}.npy", "sha256": sha256_file(ctx.input(f"golden:input_{i}.npy"))}
                       for i in range(len(cfg.inputs))],
            "outputs": sim_outputs},
        "reproducibility": {
            "recipe": "setarch -R (no address randomisation), an empty fixed environment "
                      f"({', '.join(f'{k}={v}' for k, v in sorted(RECIPE.items()))}), paths of "
                      "fixed length (a private /tmp/rknn-XXXXXXXX)",
            "why": "the toolkit writes host addresses and uninitialised memory into .rknn files; "
                   "with the recipe fp16 builds are the same on every run (tests/e2e/test_npu.py, "
                   "docs/npu.md)"},
    }
    if rebuilt is not None:
        report["reproducibility"]["rebuilt_in_this_step"] = {
            **rebuilt, "why": "RKNN-Toolkit2 2.5.0 int8 builds can still differ in a few bytes "
                              "between runs (address-like fields of the file, seen near offset "
                              "1760 in ppocr_cls.int8) while the model computes the same: the "
                              "step builds twice and lists the byte ranges that differed; the "
                              "first build ships"}
    if calibration is not None:
        report["calibration"] = calibration
    ctx.output("compile.json").write_text(pretty_json(report))


# ----------------------------------------------------------------------------- steps
def steps(project) -> list:
    layout, out = project.layout, []
    for model in project.models:
        for target in project.targets:
            out += [compile_step(layout, model, target, abi)
                    for abi in built_abis(project, model, target, RKNN)]
            for v in model.variants:
                out += [variant_step(layout, model, v, target, abi)
                        for abi in target.abis if RKNN.builds(abi)
                        and not variant_skip_reason(model, v, abi, layout.cache)]
    return out


def compile_step(layout, model, target, abi, precision: str | None = None, **int8) -> Step:
    """The model's build (the ABI's precision); int8: preprocessing, calibration, algorithm."""
    precision = precision or abi.precision
    n_out = len(model.signature["outputs"])
    golden = golden_files(layout, model)
    return Step(stage=RKNN.compile_stage, name=abi_step_name(model, target, abi), version=VERSION,
                config=Config(**abi.compile_config(), precision=precision, entry=ENTRY,
                              librknnrt=abi.librknnrt, inputs=tuple(variant_inputs(model)),
                              n_outputs=n_out, **int8),
                inputs={"model": static_model(layout, model),
                        **{k: p for k, p in golden.items() if k.startswith("golden:input_")}},
                outputs=outputs_of(n_out),
                out_dir=layout.artifact_stage(target.name, model.name, abi.name, RKNN.compile_stage),
                tools=TOOLS, action=run, layout=layout,
                doc=f"RKNN-Toolkit2 {precision} for {abi.target_platform}, simulated on the golden inputs",
                where=where(model, target, abi), after=(f"coverage:{target.name}/{model.name}",))


def variant_step(layout, model, v, target, abi) -> Step:
    """A model's int8 variant on the NPU: the fp32 static model quantized by RKNN on the
    variant's calibration samples, simulated on the variant's golden inputs; after its gate."""
    vm = variant_model(model, v)
    s = compile_step(layout, vm, target, abi, precision=v.precision,
                     preprocessing=variant_preprocessing(model),
                     calibration=Samples.from_key(v.calibration.as_dict()), algorithm="normal")
    data = {f"calibration:{p.name}": p for p in v.calibration.files}
    return dataclasses.replace(
        s, inputs={**s.inputs, "model": static_model(layout, model), **data},
        after=(f"accuracy:{full_name(model, v)}",),
        doc=f"{s.doc}, calibrated on {len(v.calibration.files)} samples of {v.name}")
