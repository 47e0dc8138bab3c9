"""Stage `validate`: run the very artifact that ships on the golden inputs and compare.

How an artifact runs is its backend's runner (compilers/<name>_backend.py) and the ABI's `run.via`:
  python  this machine's runtime (IREE's, TVM's), in a child process (x86_64 artifacts);
  qemu    the target's own runtime (aarch64 wheel) under qemu-user-static -- the shipped
          bytes, emulated: correct numerics, meaningless timings;
  vulkan  (IREE) on a Vulkan driver here; twin: a twin built for a driver here stands for it.
validation.json records what ran, where and how, and the error figures against the tolerance.
A mismatch fails the step and leaves no validation.json behind.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from ..compilers.backend import ENTRY
from ..compilers.backends import BY_NAME, backend_named, backend_of
from ..compilers.builds import built, proxy_pairs, skipped, variant_abis, variant_skip_reason
from ..core.layout import golden_files, read_golden
from ..core.numerics import EPS, compare, describe_failures, summary, tolerance_problems
from ..run.reference_noise import compare_within_noise
from ..core.steps import StageConfig, Step, abi_step_name, alone, key_value, where
from ..core.store import pretty_json, sha256_file
from ..core.tools import run_tool
from ..run import detections, shader_packs
from ..spec.variants import PRECISIONS, variant_model

# 2: float outputs held to max(declared, k x golden's noise), rows say so (reference_noise)
VERSION = 2
OUTPUTS = ("validation.json",)
# A lavapipe run has the machine to itself (doit runs steps side by side in threads): one run
# keeps about two cores busy (LLVM compiling the kernels in one thread, IREE's threads polling
# lavapipe's semaphores in others), and beside other steps it slowed down more than they gained:
# face_landmark's baseline took 428 s beside ppocr_det's, 115 s alone (2 cores).


@dataclass(frozen=True)
class Config(StageConfig):
    """An artifact's validation: which backend's runtime runs it, how it runs here, and what it
    must match."""
    compiler: str                       # the backend (compilers/backends.py) whose runtime runs it
    run: dict                           # the ABI's run: via python | qemu | vulkan | twin, and its settings
    entry: str                          # the artifact's entry point
    backend: str                        # the ABI's backend (llvm-cpu | vulkan-spirv; llvm for TVM)
    tolerance: dict                     # vs golden: max_abs, mean_abs, cosine
    precision: str | None = None        # a precision variant's: int8 | fp16 ...
    reference_tolerance: dict | None = None  # ... and what it must hold to against fp32 (its gate)
    tolerance_from: str | None = None   # where `tolerance` is declared, when not the model's own
    arithmetic: str | None = None       # the reduced precision the artifact computes in (fp16 |
    #                                     int8): its float bounds follow golden's magnitude
    #                                     (core/numerics.py); None: fp32, the declared bounds
    detections: dict | None = None      # a cut detector (spec postprocess): {cut, iou, score_abs}

    def problems(self):
        if self.compiler not in BY_NAME:
            yield f"compiler must be one of {', '.join(BY_NAME)}, got {self.compiler!r}"
        elif self.run.get("via") not in BY_NAME[self.compiler].vias:
            yield (f"run.via must be one of {', '.join(BY_NAME[self.compiler].vias)} for "
                   f"{self.compiler}, got {self.run.get('via')!r}")
        if not self.entry:
            yield "entry must name the artifact's entry point"
        yield from tolerance_problems("tolerance", self.tolerance)
        if (self.precision is None) != (self.reference_tolerance is None):
            yield "precision and reference_tolerance go together: a precision variant gives both"
        elif self.precision is not None:
            if self.precision not in PRECISIONS:
                yield f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}"
            yield from tolerance_problems("reference_tolerance", self.reference_tolerance)
        if self.arithmetic is not None and self.arithmetic not in EPS:
            yield f"arithmetic must be one of {', '.join(EPS)} (or None: fp32), got {self.arithmetic!r}"

    def as_key(self) -> dict:
        key = {"compiler": self.compiler, "run": key_value(self.run), "entry": self.entry,
               "backend": self.backend, "tolerance": key_value(self.tolerance)}
        if self.precision is not None:  # a precision variant (the fp32 keys are unchanged)
            key.update(precision=self.precision, reference_tolerance=key_value(self.reference_tolerance))
        if self.tolerance_from is not None:  # a backend's own tolerance (the NPU's, per precision)
            key["tolerance_from"] = self.tolerance_from
        if self.arithmetic is not None:  # reduced precision (fp32 keys are unchanged)
            key["arithmetic"] = self.arithmetic
        if self.detections is not None:  # a cut detector: also its detections (others unchanged)
            key["detections"] = key_value(self.detections)
        return key


def runner_argv(config: Config, artifact, inputs: list, outputs: list, where: dict,
                shader_cache: Path | None = None) -> tuple[list, dict, dict | None]:
    """The command that runs `artifact` (its backend's runner), a description of where and how
    it ran, and its environment."""
    return backend_named(config.compiler).runner(config.run, config.entry, artifact, inputs,
                                                 outputs, where, shader_cache=shader_cache)


SOFTWARE_DRIVERS = ("lavapipe", "swiftshader")  # Vulkan on this machine's CPU: one at a time


def run_and_compare(ctx, executable, runner_argv, what: str, run_hint: str, wrong_hint: str,
                    cfg: Config | None = None):
    """Run an artifact on the golden inputs through `runner_argv` (this module's, or TVM's) and
    compare with golden; returns (doc, actual, names, executed, result). Fails the step when the
    run fails or the outputs are beyond the tolerance. cfg: the step's, unless another driver
    runs the same bytes (run.also)."""
    import numpy as np  # numpy: 0.2 s, not needed by doit list

    cfg = cfg or ctx.cfg
    doc, _, expected = read_golden(ctx)
    inputs = [ctx.input(f"golden:{e['file']}") for e in doc["inputs"]]
    outputs = [ctx.scratch / f"actual_{k}.npy" for k in range(len(doc["outputs"]))]
    where = dict(stage=ctx.step.stage, **ctx.step.where)
    software = cfg.run.get("via") in ("vulkan", "twin") and cfg.run.get("driver") in SOFTWARE_DRIVERS
    with (alone() if software else contextlib.nullcontext()), \
            shader_packs.mesa_cache(ctx.step.layout, Path(executable), cfg.run, ctx.scratch,
                                    log=ctx.log) as shader_cache:  # warm when a pack is stored
        argv, executed, env = runner_argv(cfg, executable, inputs, outputs, where,
                                          shader_cache=shader_cache)
        run_tool(argv, log=ctx.log, what=f"running the {what} ({executed['where']})", env=env,
                 hint=run_hint, timeout=3600, progress=f"{ctx.step.stage}:{ctx.step.name}", **where)
    actual = [signless(np.load(p, allow_pickle=False), e) for p, e in zip(outputs, expected)]
    for p in outputs:
        p.unlink()
    names = [o["name"] for o in doc["outputs"]]
    # each float output within max(declared, k x golden's own noise): run/reference_noise.py
    result = compare_within_noise(actual, expected, names, cfg.tolerance, doc.get("noise"),
                                  cfg.arithmetic)
    if not result["passed"]:
        on = f" on {cfg.run['driver']}" if cfg is not ctx.cfg else ""
        raise ctx.error(f"outputs{on} differ from golden: {describe_failures(result)} "
                        f"({summary(result)})", hint=wrong_hint)
    return doc, actual, names, executed, result


def signless(actual, expected):
    """IREE's integers are signless: a uint8 output of the model comes back from its runtime as
    int8 with the same bytes (and uint16/32/64 likewise). Such an array is read as the model's
    declared type, bit for bit; any other dtype difference is left for compare() to report."""
    a, e = actual.dtype, expected.dtype
    if a != e and a.kind in "iu" and e.kind in "iu" and a.itemsize == e.itemsize:
        return actual.view(e)
    return actual


def _same_flags(ctx) -> None:
    """A twin stands for the shipped build only if both were compiled with the same flags but the
    Vulkan target (a fallback may have dropped a flag from one and not the other)."""

    def flags(name):
        return [f for f in json.loads(ctx.input(name).read_text())["flags"]
                if not f.startswith(("--iree-vulkan-target=", "--iree-vulkan-target-features="))]
    shipped, twin = flags("compile.json"), flags("twin.compile.json")
    if shipped != twin:
        raise ctx.error(f"the twin was compiled with other flags than the shipped artifact "
                        f"(shipped: {' '.join(shipped)}; twin: {' '.join(twin)}): its validation "
                        f"would not speak for the shipped bytes",
                        hint="a fallback worked for one target and not the other: give the ABI a "
                             "fallback both can take, or skip the ABI for this model")


def run(ctx) -> None:
    import numpy as np  # numpy: 0.2 s, not needed by doit list

    cfg = ctx.cfg
    backend = backend_named(cfg.compiler)
    twin = cfg.run["via"] == "twin"
    if twin:
        _same_flags(ctx)
    doc, actual, names, executed, result = run_and_compare(
        ctx, ctx.input("twin.artifact" if twin else "artifact"), runner_argv,
        what="twin" if twin else backend.what, run_hint=backend.run_hint,
        wrong_hint=backend.wrong_hint)
    also = []  # the same bytes on each other driver the ABI names: all must agree with golden
    for driver in cfg.run.get("also", ()):
        other = dataclasses.replace(cfg, run={**cfg.run, "driver": driver})
        _, _, _, on_other, other_result = run_and_compare(
            ctx, ctx.input("twin.artifact" if twin else "artifact"), runner_argv,
            what="twin" if twin else backend.what, run_hint=backend.run_hint,
            wrong_hint=f"{backend.wrong_hint}; it passed on {cfg.run['driver']}: two independent "
                       f"drivers disagree, so one of them (or the build) is wrong: check on the "
                       f"device (bench/vulkan_gpu.py) before shipping", cfg=other)
        also.append({"driver": driver, "device": on_other["device"],
                     "outputs": other_result["outputs"]})
    vs_fp32 = None
    if cfg.reference_tolerance is not None:  # a precision variant: also against fp32, within its gate
        reference = [np.load(ctx.input(f"golden:{e['file']}"), allow_pickle=False)
                     for e in doc["reference"]]
        vs_fp32 = compare([a.astype(r.dtype) for a, r in zip(actual, reference)], reference, names,
                          cfg.reference_tolerance)
        if not vs_fp32["passed"]:
            raise ctx.error(f"the {cfg.precision} artifact differs from fp32 beyond the "
                            f"variant's gate: {describe_failures(vs_fp32)} ({summary(vs_fp32)})",
                            hint="the variant passed its gate in onnxruntime; the compiled form "
                                 "does not: compare with its own golden (validation.json)")
    report = {"status": "passed", "executed": executed, "tolerance": cfg.tolerance,
              "outputs": result["outputs"], "shipped_bytes_executed": not twin}
    if cfg.detections is not None:  # postprocess.onnx on the artifact's and golden's outputs
        det = cfg.detections
        report["detections"] = detections.check(ctx.input("postprocess.onnx"), det["cut"], actual,
                                                *read_golden(ctx), det["iou"], det["score_abs"])
        if not report["detections"]["passed"]:
            raise ctx.error(f"detections differ from golden's: {detections.describe(report['detections'])}",
                            hint="the raw outputs passed; compare the boxes and scores near the "
                                 "post-processing's thresholds, or loosen postprocess.iou/score_abs")
    if cfg.arithmetic is not None:  # each float row's `tolerance`: the bounds it was held to
        report["arithmetic"] = cfg.arithmetic
    if cfg.tolerance_from is not None:
        report["tolerance_from"] = cfg.tolerance_from
    if also:
        report["also"] = also
    if executed.get("simulated"):  # the NPU: its simulator ran the model exported as this file
        report["simulated"] = True
        report["shipped_bytes_executed"] = False
    if vs_fp32 is not None:
        report["vs_fp32"] = {"tolerance": cfg.reference_tolerance,
                             "outputs": vs_fp32["outputs"]}
    if twin:
        # The shipped bytes were not run: say exactly what was, and what is still owed.
        report["status"] = "twin-passed"
        report["twin"] = {"vulkan_target": cfg.run["twin"],
                          "sha256": sha256_file(ctx.input("twin.artifact")),
                          "shipped_sha256": sha256_file(ctx.input("artifact")),
                          "why": "the shipped artifact assumes a device this machine does not "
                                 "have (its kernels would run here and return wrong numbers)",
                          "still_needed": "run the shipped artifact on the board and compare with "
                                          "golden before relying on it"}
    ctx.output("validation.json").write_text(pretty_json(report))


# ----------------------------------------------------------------------------- steps
def steps(project) -> list:
    """Every artifact the graph builds is run and compared with golden: every backend's (models,
    precision variants), and those of the host proxies of another target's choice."""
    layout, out = project.layout, []
    for model in project.models:
        for target in project.targets:
            out += [validate_step(layout, model, target, a) for a in target.abis
                    if built(project, model, target, a)]
        for v in model.variants:
            vm = variant_model(model, v)
            out += [_variant(validate_step(layout, vm, target, abi, v.precision), v)
                    for target in project.targets for abi in variant_abis(target)
                    if not variant_skip_reason(model, v, abi, layout.cache)]
    for model in project.models:
        for target, abi in proxy_pairs(project):
            if backend_of(abi) not in skipped(project, model, target):
                out.append(validate_step(layout, model, target, abi))
    return out


def validate_step(layout, model, target, abi, precision: str | None = None) -> Step:
    backend = backend_of(abi)
    compiled = layout.artifact_stage(target.name, model.name, abi.name, backend.compile_stage)
    inputs = {"artifact": compiled / backend.artifact, **golden_files(layout, model),
              **backend.validation_inputs(compiled, len(model.signature["outputs"]))}
    tolerance, tolerance_from = (backend.validation_tolerance(abi, precision)
                                 or (model.tolerance.as_dict(), None))
    pp = model.postprocess  # a cut detector: its post-processing runs on the outputs
    if pp:
        inputs["postprocess.onnx"] = layout.model_stage(pp["model"], "static") / "postprocess.onnx"
    # what the artifact computes in: a variant's precision, or the ABI's own (the NPU builds an
    # fp32 model in fp16); fp32 otherwise
    arithmetic = precision or getattr(abi, "precision", None)
    via = abi.run["via"]
    if via == "twin":
        twin = layout.artifact_stage(target.name, model.name, abi.name, "twin_compile")
        inputs["twin.artifact"] = twin / backend.artifact
        inputs["compile.json"] = compiled / "compile.json"      # the twin must have been built
        inputs["twin.compile.json"] = twin / "compile.json"     # with the shipped build's flags
    return Step(stage="validate", name=abi_step_name(model, target, abi), version=VERSION,
                config=Config(compiler=backend.name, run=abi.run, entry=ENTRY, backend=abi.backend,
                              tolerance=tolerance, tolerance_from=tolerance_from,
                              arithmetic=None if arithmetic == "fp32" else arithmetic,
                              detections={k: pp[k] for k in ("cut", "iou", "score_abs")} if pp else None),
                inputs=inputs, outputs=OUTPUTS,
                out_dir=layout.artifact_stage(target.name, model.name, abi.name, "validate"),
                tools=backend.validation_tools(abi.run), action=run, layout=layout,
                doc=(f"run the twin ({abi.run.get('twin')}) on {abi.run.get('driver')} and compare with golden"
                     if via == "twin" else f"run the {backend.what} ({via}) and compare with golden"),
                where=where(model, target, abi))


def _variant(step, v):
    """A variant's validation also holds it to fp32, within its gate."""
    folder = step.inputs["golden.json"].parent
    n_out = sum(1 for k in step.inputs if k.startswith("golden:output_"))
    refs = {f"golden:reference_{k}.npy": folder / f"reference_{k}.npy" for k in range(n_out)}
    return dataclasses.replace(
        step, inputs={**step.inputs, **refs},
        config=dataclasses.replace(step.cfg, precision=v.precision,
                                   reference_tolerance=v.gate.sample_tolerance()),
        doc=f"{step.doc}, and with fp32 within the gate")
