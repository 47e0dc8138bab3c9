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

Per-layer divergence (int8 only): int8 children run the driver through run/rknn_analysis.py, and
the first one then runs the toolkit's accuracy_analysis on the golden inputs, in its simulator:
the int8 model it built against the toolkit's own fp32 run of the same graph, every layer's
cosine and euclidean distance, "entire" (errors accumulated from the input) and "single" (the
layer's own). accuracy_analysis.json holds that table with the sha256 of the .rknn it describes;
compile.json (and the manifest) the worst layers; `doit accuracy` prints them. It runs after
export and inference, which it cannot change; fp16 children run the driver alone, unchanged (its
source text moves the addresses in the file).
"""
from __future__ import annotations

import dataclasses
import json
import platform
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ..compilers.backend import ENTRY
from ..compilers.builds import built_abis, variant_skip_reason
from ..compilers.rknn_backend import RKNN, simulated_output
from ..core.layout import golden_files, static_model
from ..core.steps import StageConfig, Step, abi_step_name, where
from ..core.store import canonical_json, pretty_json, sha256_file, sha256_text
from ..core.tools import Budget, describe_exit, rknn_toolkit, run_tool, step_budget, tail
from ..run import rknn_analysis, rknn_driver  # the child's sources: imported to count in the key
from ..spec.npu import NPU_PRECISIONS
from ..spec.samples import Samples, load_data
from ..spec.variants import full_name, variant_inputs, variant_model, variant_preprocessing

VERSION = 1
TOOLS = ("rknn-toolkit2",)
DRIVER = Path(rknn_driver.__file__)
ANALYSER = Path(rknn_analysis.__file__)  # int8: the driver's run, then accuracy_analysis
ANALYSIS = "accuracy_analysis.json"   # int8: the toolkit's per-layer table (accuracy.py reads it)
# The child's whole environment (nothing of the caller's: its size moves the toolkit's addresses).
RECIPE = {"MALLOC_PERTURB_": "165", "PYTHONHASHSEED": "0", "LC_ALL": "C", "PATH": "/usr/bin:/bin",
          "OMP_NUM_THREADS": "1"}
ALGORITHMS = ("normal", "mmse", "kl_divergence")
# The time the toolkit may take for one step, from the static model's size and node count:
# measured 9 s (ppocr_cls, 0.6 MB, 566 nodes) and 16 s (ppocr_det, 1.8 MB, 464 nodes) for fp16
# here; the budget gives those ~20-40x, and stops a build the toolkit does not finish (a GRU
# speech model ran past 11 minutes at 100% of a core) within minutes instead of an hour. An int8
# step builds twice and runs the per-layer analysis: INT8_FACTOR times as long. A model spec
# overrides it: `npu: {budget_s: N}` (spec/npu.py).
BUDGET = {"base": 60, "per_mb": 30, "per_node": 0.5, "floor": 120, "ceiling": 1800}
INT8_FACTOR = 3
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def outputs_of(n_outputs: int, precision: str) -> tuple[str, ...]:
    return (RKNN.artifact, "compile.json", *(simulated_output(k) for k in range(n_outputs)),
            *((ANALYSIS,) if precision == "int8" else ()))


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
    budget_s: int | None = None         # the model spec's npu.budget_s (None: from the model, budget())

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
        if self.budget_s is not None and not (isinstance(self.budget_s, int) and self.budget_s >= 1):
            yield f"budget_s must be a whole number of seconds, at least 1, got {self.budget_s!r}"

    def as_key(self) -> dict:
        """Every field; budget_s only when the spec sets it (the budget decides whether a build
        is waited for, not what it makes: builds without one keep their keys)."""
        key = super().as_key()
        if self.budget_s is None:
            del key["budget_s"]
        return key

    @classmethod
    def from_key(cls, key: dict) -> "Config":
        return cls(**{**key, "calibration": key["calibration"] and Samples.from_key(key["calibration"])})


# ----------------------------------------------------------------------------- the stage
def graph_nodes(path: Path) -> int:
    """The nodes of an ONNX model, those of its subgraphs (If, Loop, Scan bodies) included."""
    import onnx  # onnx: 0.3 s, not needed by doit list

    def count(graph) -> int:
        return sum(1 + sum(count(a.g) for a in n.attribute if a.type == onnx.AttributeProto.GRAPH)
                   + sum(count(g) for a in n.attribute for g in a.graphs) for n in graph.node)
    return count(onnx.load(str(path), load_external_data=False).graph)


def budget(cfg: Config, model: Path) -> Budget:
    """How long the toolkit may take for this step: the spec's npu.budget_s, or from the static
    model's size and node count (BUDGET; an int8 step INT8_FACTOR times as long)."""
    if cfg.budget_s is not None:
        return step_budget(0, 0, **BUDGET, override=cfg.budget_s,
                           override_from=f"the model spec, npu: {{budget_s: {cfg.budget_s}}}")
    return step_budget(model.stat().st_size, graph_nodes(model), **BUDGET,
                       factor=INT8_FACTOR if cfg.precision == "int8" else 1)


def over_budget(ctx, cfg: Config, tk, limit: Budget, ran_s: float) -> Exception:
    """The step's error when the toolkit ran past its budget (its process group was killed)."""
    model, abi = ctx.step.where["model"], ctx.step.where["target"].split("/")[-1]
    base = model.split(".")[0]
    return ctx.error(
        f"RKNN-Toolkit2 {tk.version} did not finish the {cfg.precision} build for "
        f"{cfg.target_platform} within the step's budget of {limit.seconds} s ({limit.how}); "
        f"stopped after {ran_s:.0f} s (the toolkit's processes were killed)", log=True,
        hint=f"leave the model off the NPU in models/{base}/model.yaml (`skip: {{{abi}: <why>}}`), "
             f"or, if it is known to need longer, raise its budget there (`npu: {{budget_s: "
             f"{max(2 * limit.seconds, 60)}}}`)")


def driver_argv(cfg: Config, root: Path, analysis: bool = False) -> list[str]:
    """The child's command line, all paths relative to its private root (pure: no toolchain).
    int8 runs the driver through rknn_analysis.py (analysis: with the toolkit's accuracy_analysis
    into analysis/); fp16 runs the driver itself, as it always has (its bytes depend on it)."""
    int8 = cfg.precision == "int8"
    argv = ["setarch", platform.machine(), "-R", f"{root}/venv/bin/python",
            "analysis.py" if int8 else "driver.py",
            "--model", "model.onnx", "--out", RKNN.artifact, "--platform", cfg.target_platform,
            "--precision", cfg.precision]
    if int8:
        argv += ["--dataset", "dataset.txt", "--algorithm", cfg.algorithm]
    argv += [a for i in range(len(cfg.inputs)) for a in ("--input", f"input_{i}.npy")]
    argv += [a for k in range(cfg.n_outputs) for a in ("--sim-output", simulated_output(k))]
    if int8:
        argv += ["--driver", "driver.py"] + (["--analysis", "analysis"] if analysis else [])
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


_FIGURES = r"(?P<ec>\S+) \| (?P<ee>\S+)\s+(?P<sc>\S+) \| (?P<se>\S+)"
_LAYER = re.compile(r"^\[(?P<op>[^\]]*)\] (?P<layer>.*?)(?:\s+" + _FIGURES + r")?\s*$")


def parse_error_analysis(text: str) -> list[dict]:
    """The table of the toolkit's error_analysis.txt, one row per layer in its order: the op
    (RKNN's, after its own rewrites), the layer (its output tensor), and the cosine and euclidean
    distance to the toolkit's fp32 run, `entire` (accumulated from the input) and `single` (the
    layer's own); None where the toolkit prints no figures (a Conv fused with the activation
    after it). A line of the table that does not read so is an error."""
    rows, table = [], False
    for line in text.splitlines():
        if line.startswith("-----"):
            table = True
        elif table and line.strip():
            m = _LAYER.match(line.rstrip())
            if m is None:
                raise ValueError(f"a line of error_analysis.txt does not read as a layer: {line!r}")
            fig = lambda c, e: None if m.group(c) is None else {"cosine": float(m.group(c)),
                                                                "euclidean": float(m.group(e))}
            rows.append({"index": len(rows), "layer": m.group("layer"), "op": m.group("op"),
                         "entire": fig("ec", "ee"), "single": fig("sc", "se")})
    if not rows:
        raise ValueError("error_analysis.txt has no layer table (no line of dashes, then layers)")
    return rows


def worst_first(rows: list[dict], which: str) -> list[int]:
    """Indices of the rows with `which` (entire | single) figures, lowest cosine first."""
    return sorted((r["index"] for r in rows if r[which] is not None),
                  key=lambda i: rows[i][which]["cosine"])


def analysis_record(rows: list[dict], artifact: dict, inputs: list[dict], toolkit: str) -> dict:
    """accuracy_analysis.json: the table, what it compares, and the file it was computed for."""
    return {"what": "RKNN-Toolkit2's accuracy_analysis in its simulator: the int8 model this step "
                    "built (exported as the file below) against the toolkit's own fp32 run of the "
                    "same graph, layer by layer, on the golden inputs",
            "toolkit": toolkit, "artifact": artifact, "inputs": inputs,
            "figures": {"entire": "each layer's output vs fp32, the errors of the layers before "
                                  "it accumulated",
                        "single": "the layer's own error, without those of the layers before it "
                                  "(the toolkit: 'single-layer output error')",
                        "cosine": "cosine similarity (1: same direction)",
                        "euclidean": "euclidean distance (in the layer's units)",
                        "null": "the toolkit printed no figures for the layer (seen: a Conv fused "
                                "with the activation after it)"},
            "worst_first": {w: worst_first(rows, w) for w in ("single", "entire")},
            "layers": rows}


def analysis_summary(record: dict) -> dict:
    """compile.json's (and the manifest's) short form: the worst layer by each cosine."""
    def worst(which):
        order = record["worst_first"][which]
        r = record["layers"][order[0]] if order else None
        return r and {"layer": r["layer"], "op": r["op"], "cosine": r[which]["cosine"]}
    return {"file": ANALYSIS, "what": "RKNN-Toolkit2's simulator, int8 vs its fp32 run, per layer "
                                      "(golden inputs)",
            "layers": len(record["layers"]), "worst_single": worst("single"),
            "worst_entire": worst("entire")}


def _stage_inputs(ctx, cfg: Config, root: Path) -> dict | None:
    """Copy the model and golden inputs into the child's root under fixed names; for int8 write
    the calibration samples as .npy files and the toolkit's dataset list. Returns what the
    calibration was (for compile.json)."""
    import numpy as np  # numpy: 0.2 s, not needed by doit list
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


def _child(ctx, cfg: Config, tk, where: dict, limit: Budget, deadline: float,
           analysis: bool = False) -> tuple[Path, dict | None, dict, dict]:
    """One run of the driver in a fresh private root: (root, calibration, summary, messages);
    analysis: the toolkit's accuracy_analysis too (root/analysis/). It is killed at `deadline`
    (time.monotonic(): the step's budget, `limit`, shared by its runs). The caller removes the
    root; a failure removes it and raises the step's error."""
    # A private root whose path has the same length every time (mkdtemp: 8 random characters).
    root = Path(tempfile.mkdtemp(prefix="rknn-", dir="/tmp"))
    try:
        (root / "venv").symlink_to(tk.venv.resolve())
        shutil.copyfile(DRIVER, root / "driver.py")
        if cfg.precision == "int8":
            shutil.copyfile(ANALYSER, root / "analysis.py")
        calibration = _stage_inputs(ctx, cfg, root)
        started = time.monotonic()
        result = run_tool(driver_argv(cfg, root, analysis), log=ctx.log, what="RKNN-Toolkit2 build + simulator",
                          cwd=root, env={**RECIPE, "HOME": str(root)}, check=False,
                          timeout=max(deadline - started, 0.1),
                          progress=f"{ctx.step.stage}:{ctx.step.name}", **where)
        if result.timed_out:
            raise over_budget(ctx, cfg, tk, limit, time.monotonic() - deadline + limit.seconds)
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


def _analysis(ctx, root: Path, tk, golden_inputs: list[dict]) -> dict:
    """The first int8 child's error_analysis.txt as accuracy_analysis.json (returned too)."""
    try:
        rows = parse_error_analysis((root / "analysis" / "error_analysis.txt").read_text())
    except (OSError, ValueError) as exc:
        raise ctx.error(f"RKNN-Toolkit2 {tk.version}'s accuracy_analysis: {exc}", log=True,
                        hint="no file: run/rknn_analysis.py's hook did not run (the driver must "
                             "release its model once, at the end); a line it cannot read: adapt "
                             "rknn_compile.parse_error_analysis to the toolkit's version")
    record = analysis_record(
        rows, {"file": RKNN.artifact, "sha256": sha256_file(ctx.output(RKNN.artifact))},
        golden_inputs, f"rknn-toolkit2 {tk.version}")
    ctx.output(ANALYSIS).write_text(pretty_json(record))
    return record


def run(ctx) -> None:
    cfg = ctx.cfg
    where = dict(stage=ctx.step.stage, **ctx.step.where)
    tk = rknn_toolkit(**where)
    limit = budget(cfg, ctx.input("model"))
    deadline = time.monotonic() + limit.seconds
    root, calibration, summary, messages = _child(ctx, cfg, tk, where, limit, deadline,
                                                  cfg.precision == "int8")
    golden_inputs = [{"file": f"input_{i}.npy", "sha256": sha256_file(ctx.input(f"golden:input_{i}.npy"))}
                     for i in range(len(cfg.inputs))]
    analysis = None
    try:
        shutil.copyfile(root / RKNN.artifact, ctx.output(RKNN.artifact))
        sim_outputs = []
        for k in range(cfg.n_outputs):
            shutil.copyfile(root / simulated_output(k), ctx.output(simulated_output(k)))
            sim_outputs.append({"file": simulated_output(k),
                                "sha256": sha256_file(ctx.output(simulated_output(k))),
                                **summary["outputs"][k]})
        if cfg.precision == "int8":
            analysis = _analysis(ctx, root, tk, golden_inputs)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    rebuilt = None
    if cfg.precision == "int8":  # int8 builds were seen to differ in a few bytes even with the
        again, *_ = _child(ctx, cfg, tk, where, limit, deadline)  # recipe: build again, say what differs
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
            "inputs": golden_inputs,
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
    if analysis is not None:
        report["accuracy_analysis"] = analysis_summary(analysis)
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
                              n_outputs=n_out, budget_s=model.npu.get("budget_s"), **int8),
                inputs={"model": static_model(layout, model),
                        **{k: p for k, p in golden.items() if k.startswith("golden:input_")}},
                outputs=outputs_of(n_out, precision),
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
