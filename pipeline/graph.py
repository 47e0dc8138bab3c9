"""The build graph: which steps exist for the models and targets, and how their files connect.

    import ─┬─> golden ─> static ─> coverage ─> iree_compile (per target ABI) ─> validate ─┬─> choose ─> manifest
            └────────────────^                  └─> [tvm_tune ─>] tvm_compile ─> validate ─┘   (per target)
Precision variants (pipeline/variants.py) branch off static with their own chains (IREE only):
    static ─> quantize ─> accuracy (gate) ─> golden ─> iree_compile ─> validate ─> manifest
Shape variants (pipeline/shapes.py) are models of their own that share their model's import.
Each function returns `Step`s; dodo.py turns them into doit tasks. The TVM steps, op coverage
and the compiler choice are made in tvm_graph.py; an ABI whose compiler cannot take a model
(coverage.py), or that the model's spec skips, has no steps for that model.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from . import golden, import_model, iree_compile, manifest, sources, static, tvm_graph, validate, variants
from .layout import Layout
from .spec import TARGETS_DIR, ModelSpec, TargetSpec, known_targets, load_models, load_target
from .steps import Step
from .store import use_memo


@dataclass(frozen=True)
class Project:
    layout: Layout
    models: tuple[ModelSpec, ...]
    targets: tuple[TargetSpec, ...]
    coverage: dict = field(default_factory=dict)   # model -> coverage.predict()
    proxies: tuple = ()       # targets loaded only for their ABIs that proxy another's (choice.py)
    farm: dict = field(default_factory=dict)       # tracker=, key=, emulated= (doit tune)

    def built(self, model: ModelSpec, target: TargetSpec, abi) -> bool:
        """False when the spec skips the ABI, or op coverage says its compiler cannot take the model."""
        return (not model.skip_reason(abi.name)
                and tvm_graph.compiler_of(abi) not in tvm_graph.skipped(self, model, target))

    def steps(self, stage: str) -> list[Step]:
        out = []
        for model in self.models:
            if stage == "import" and model.shape_of:
                continue  # a shape variant shares its model's source and import step
            if stage in ("import", "golden", "static"):
                out.append(STAGE_STEPS[stage](self.layout, model))
            elif stage in ("iree_compile", "validate"):
                for target in self.targets:
                    for abi in [a for a in target.abis if self.built(model, target, a)]:
                        out.append(STAGE_STEPS[stage](self.layout, model, target, abi))
                        if stage == "iree_compile" and abi.run["via"] == "twin":
                            out.append(compile_step(self.layout, model, target, abi, twin=True))
            out += variants.steps(self.layout, model, self.targets, stage)
        if stage == "manifest":
            out = [tvm_graph.extend_manifest(self, manifest_step(self.layout, self.models, t,
                                                                 built=self.built), t)
                   for t in self.targets]
        return out + tvm_graph.steps(self, stage)


def load_project(models: str | Path, artifacts: str | Path, target: str | None,
                 targets_dir: str | Path | None = None, farm: dict | None = None) -> Project:
    """Specs validated up front (all problems at once); target=None means every known target."""
    layout = Layout(Path(artifacts).resolve())
    use_memo(layout.cache / "hashes.json")
    targets_dir = Path(targets_dir).resolve() if targets_dir else TARGETS_DIR
    names = [target] if target else known_targets(targets_dir)
    targets = tuple(load_target(n, targets_dir, memo_dir=layout.cache) for n in names)
    specs = load_models(Path(models).resolve(), memo_dir=layout.cache)
    return tvm_graph.complete(Project(layout, specs, targets, farm=dict(farm or {})), targets_dir)


# ----------------------------------------------------------------------------- per stage
def _golden_files(layout: Layout, model: ModelSpec) -> dict:
    folder = layout.model_stage(model.name, "golden")
    n_out = len(model.signature["outputs"])
    files = {"golden.json": folder / "golden.json"}
    for name in golden.outputs_for(len(model.inputs), n_out)[1:]:
        files[f"golden:{name}"] = folder / name
    return files


def import_step(layout: Layout, model: ModelSpec) -> Step:
    config = {"opset": model.opset}
    if model.source_format != "onnx":  # converted to ONNX first (sources.py); ONNX keys unchanged
        config.update(format=model.source_format, route=sources.ROUTES[model.source_format],
                      io={k: model.signature[k] for k in ("inputs", "outputs")},
                      custom_ops=model.signature.get("custom_ops", []))
    return Step(stage="import", name=model.name, version=import_model.VERSION,
                config=config, inputs=sources.source_files(model.source),
                outputs=import_model.OUTPUTS, out_dir=layout.model_stage(model.name, "import"),
                tools=("onnx",) + sources.TOOLS[model.source_format], action=import_model.run,
                layout=layout,
                doc=f"check {model.source.name} and normalise it to opset >= {model.opset}",
                where={"model": model.name})


def golden_step(layout: Layout, model: ModelSpec) -> Step:
    # the reference: the source itself (onnxruntime, or LiteRT for TFLite); for NNEF, which has no
    # interpreter here, onnxruntime on its conversion
    fmt = model.source_format
    inputs = ({"source": layout.model_stage(model.base, "import") / "model.onnx"} if fmt == "nnef"
              else {"source": model.source})
    for spec in model.inputs:
        if spec.test_data.kind == "file":
            inputs[f"test_data:{spec.name}"] = spec.test_data.file
    n_out = len(model.signature["outputs"])
    return Step(stage="golden", name=model.name, version=golden.VERSION,
                config={"inputs": [i.as_dict() for i in model.inputs], "n_outputs": n_out,
                        **({"reference": sources.GOLDEN[fmt],
                            "outputs": [o["name"] for o in model.signature["outputs"]]}
                           if fmt != "onnx" else {})},
                inputs=inputs, outputs=golden.outputs_for(len(model.inputs), n_out),
                out_dir=layout.model_stage(model.name, "golden"),
                tools=("onnxruntime", "numpy") + (("ai-edge-litert",) if fmt == "tflite" else ()),
                action=golden.run, layout=layout,
                doc=f"{sources.GOLDEN[fmt]} outputs on the fixed test inputs",
                where={"model": model.name}, after=(f"import:{model.base}",))


def static_step(layout: Layout, model: ModelSpec) -> Step:
    inputs = {"model": layout.model_stage(model.base, "import") / "model.onnx",
              **_golden_files(layout, model)}
    return Step(stage="static", name=model.name, version=static.VERSION,
                config={"inputs": [{"name": i.name, "shape": list(i.shape), "dtype": i.dtype}
                                   for i in model.inputs],
                        "tolerance": model.tolerance.as_dict()},
                inputs=inputs, outputs=static.OUTPUTS,
                out_dir=layout.model_stage(model.name, "static"),
                tools=("onnx", "onnxsim", "onnxruntime", "numpy"), action=static.run,
                layout=layout, doc="bind shapes, simplify (onnxsim), check against golden",
                where={"model": model.name})


def _abi_name(model: ModelSpec, target: TargetSpec, abi) -> str:
    return f"{target.name}/{model.name}/{abi.name}"


def compile_step(layout: Layout, model: ModelSpec, target: TargetSpec, abi, twin: bool = False) -> Step:
    """The shipped artifact; or (twin=True) its runnable twin: same model and flags, another device."""
    config = abi.twin_config() if twin else abi.compile_config()
    if abi.backend == "vulkan-spirv":
        doc = f"IREE Vulkan SPIR-V for {config['vulkan_target']}" + (" (validation twin)" if twin else "")
    else:
        doc = f"IREE {abi.backend} for {abi.triple} ({abi.cpu})"
    return Step(stage="iree_compile", name=_abi_name(model, target, abi) + ("/twin" if twin else ""),
                version=iree_compile.VERSION,
                config={**config, "entry": static.ENTRY},
                inputs={"model": layout.model_stage(model.name, "static") / "model.onnx"},
                outputs=iree_compile.OUTPUTS,
                out_dir=layout.artifact_stage(target.name, model.name, abi.name,
                                              "twin_compile" if twin else "iree_compile"),
                tools=("iree-base-compiler", "onnx"), action=iree_compile.run, layout=layout,
                doc=doc, where={"model": model.name, "target": f"{target.name}/{abi.name}"},
                after=(f"coverage:{target.name}/{model.name}",))


def validate_step(layout: Layout, model: ModelSpec, target: TargetSpec, abi) -> Step:
    compiled = layout.artifact_stage(target.name, model.name, abi.name, "iree_compile")
    inputs = {"vmfb": compiled / "model.vmfb", **_golden_files(layout, model)}
    via = abi.run["via"]
    if via == "twin":
        inputs["twin.vmfb"] = layout.artifact_stage(target.name, model.name, abi.name,
                                                    "twin_compile") / "model.vmfb"
    tools = {"python": ("iree-base-runtime", "numpy"),
             "qemu": ("iree-runtime-aarch64", "qemu-aarch64-static", "numpy"),
             "vulkan": ("iree-base-runtime", "numpy", f"vulkan-driver:{abi.run.get('driver')}"),
             "twin": ("iree-base-runtime", "numpy", f"vulkan-driver:{abi.run.get('driver')}")}[via]
    return Step(stage="validate", name=_abi_name(model, target, abi), version=validate.VERSION,
                config={"run": abi.run, "entry": static.ENTRY, "backend": abi.backend,
                        "tolerance": model.tolerance.as_dict()},
                inputs=inputs,
                outputs=validate.OUTPUTS,
                out_dir=layout.artifact_stage(target.name, model.name, abi.name, "validate"),
                tools=tools, action=validate.run, layout=layout,
                doc=(f"run the twin ({abi.run.get('twin')}) on {abi.run.get('driver')} and compare with golden"
                     if via == "twin" else f"run the artifact ({via}) and compare with golden"),
                where={"model": model.name, "target": f"{target.name}/{abi.name}"})


def manifest_step(layout: Layout, models: tuple[ModelSpec, ...], target: TargetSpec,
                  built=lambda model, target, abi: True) -> Step:
    inputs = {}
    for model in models:
        inputs[f"{model.name}:static.json"] = layout.model_stage(model.name, "static") / "static.json"
        inputs[f"{model.name}:static.onnx"] = layout.model_stage(model.name, "static") / "model.onnx"
        inputs[f"{model.name}:golden.json"] = layout.model_stage(model.name, "golden") / "golden.json"
        for abi in [a for a in target.abis if built(model, target, a)]:
            prefix = f"{model.name}:{abi.name}"
            compiled = layout.artifact_stage(target.name, model.name, abi.name, "iree_compile")
            checked = layout.artifact_stage(target.name, model.name, abi.name, "validate")
            inputs[f"{prefix}:model.vmfb"] = compiled / "model.vmfb"
            inputs[f"{prefix}:compile.json"] = compiled / "compile.json"
            inputs[f"{prefix}:compile.step"] = compiled / "step.json"
            inputs[f"{prefix}:validation.json"] = checked / "validation.json"
            inputs[f"{prefix}:validate.step"] = checked / "step.json"
        inputs.update(variants.manifest_inputs(layout, model, target))
    models_cfg = [{"name": m.name, "description": m.description,
                   "source": {"file": m.source.name, "sha256": m.source_sha256,
                              **({"format": m.source_format, "route": sources.ROUTES[m.source_format],
                                  "golden": sources.GOLDEN[m.source_format]}
                                 if m.source_format != "onnx" else {})},
                   **({"shape_of": m.shape_of, "shape": m.shape} if m.shape_of else {}),
                   **({"shapes": list(m.shapes)} if m.shapes else {}),
                   "licenses": [p.name for p in m.licenses],
                   "skipped": {a.name: m.skip_reason(a.name) for a in target.all_abis
                               if m.skip_reason(a.name)},
                   "abis": [a.name for a in target.abis if built(m, target, a)]} for m in models]
    models_cfg += [v for m in models for v in variants.manifest_models(layout, m, target)]
    target_cfg = {"name": target.name, "description": target.description,
                  "definition_sha256": target.sha256, "fallback": list(target.fallback),
                  "abis": [{"name": a.name, **a.compile_config(), "run": a.run} for a in target.abis]}
    return Step(stage="manifest", name=target.name, version=manifest.VERSION,
                config={"target": target_cfg, "models": models_cfg}, inputs=inputs,
                outputs=manifest.OUTPUTS, out_dir=layout.root / target.name, tools=(),
                action=manifest.run, layout=layout, owns_dir=False,
                doc=f"artifacts/{target.name}/manifest.json: every validated artifact with its sha256",
                where={"target": target.name})


STAGE_STEPS = {"import": import_step, "golden": golden_step, "static": static_step,
               "iree_compile": compile_step, "validate": validate_step}
STAGES = ("import", "golden", "static", "quantize", "accuracy", "coverage", "iree_compile",
          "tvm_tune", "tvm_compile", "validate", "choose", "manifest")
