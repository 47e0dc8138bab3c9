"""Stage `manifest`: what ships for one target, every artifact with its sha256.

artifacts/<target>/manifest.json lists, per model: the source (file, sha256), the I/O contract
(names, shapes, dtypes of the compiled entry point), and per target ABI the artifact (path,
sha256, size), the compile step's key and tool versions, and how it was validated (what ran,
where, emulated or not, the error figures against the tolerance). Paths are relative to the
artifacts folder; there are no timestamps: the same build gives the same bytes.
A precision variant that passed its gate is an entry of its own, `<model>.<variant>`, with
variant_of, precision, quantization, accuracy and per artifact precision and validation.vs_fp32
(pipeline/variants.py: manifest_fields).

Besides IREE's `.vmfb` entries, a model's `artifacts` holds its TVM builds (`format: tvm-so`,
`abi.compiler: tvm`, the same `validation` shape, plus `tuning` when a database was applied);
`coverage` says per compiler whether it could take the model (and which ops it could not, how
that was checked); `skipped` maps each ABI left out to why (the spec's `skip:` reason, or op
coverage); `choice` says, per slot of the target, which artifact ships, by which policy and why,
with each candidate's figures.
"""
from __future__ import annotations

import json

from ..core.store import pretty_json, sha256_file
from pathlib import Path
from ..spec.sources import GOLDEN
from ..spec.sources import ROUTES
from ..core.steps import Step
from ..spec.variants import full_name
from .plan import budget, built, coverage_file, static_model, tvm_abis, variant_skip_reason

VERSION = 2  # 2: TVM artifacts, coverage, skipped, choice
OUTPUTS = ("manifest.json",)
SCHEMA = "modelyard.manifest/1"


def _json(ctx, name: str) -> dict:
    return json.loads(ctx.input(name).read_text())


def run(ctx) -> None:
    cfg = ctx.config
    layout = ctx.step.layout
    models = {}
    for model in cfg["models"]:
        name = model["name"]
        static = _json(ctx, f"{name}:static.json")
        golden = _json(ctx, f"{name}:golden.json")
        artifacts = {}
        built = model.get("abis")  # a precision variant's entry lists its skips only
        for abi in cfg["target"]["abis"]:
            if abi["name"] in model["skipped"] or (built is not None and abi["name"] not in built):
                continue
            prefix = f"{name}:{abi['name']}"
            vmfb = ctx.input(f"{prefix}:model.vmfb")
            compile_step = _json(ctx, f"{prefix}:compile.step")
            compile_report = _json(ctx, f"{prefix}:compile.json")
            validation = _json(ctx, f"{prefix}:validation.json")
            validate_step = _json(ctx, f"{prefix}:validate.step")
            artifacts[abi["name"]] = {
                "path": layout.relative(vmfb),
                "sha256": sha256_file(vmfb),
                "size": vmfb.stat().st_size,
                "format": "iree-vmfb",
                "entry": compile_report["entry"],
                "abi": abi,
                "compile": {"step_key": compile_step["key"], "flags": compile_report["flags"],
                            "tools": compile_step["key_parts"]["tools"]},
                "requires": compile_report.get("requires", {}),
                "validation": {"status": validation["status"], "executed": validation["executed"],
                               "shipped_bytes_executed": validation["shipped_bytes_executed"],
                               **({"twin": validation["twin"]} if "twin" in validation else {}),
                               "tolerance": validation["tolerance"],
                               "outputs": validation["outputs"],
                               "step_key": validate_step["key"],
                               "tools": validate_step["key_parts"]["tools"]},
            }
        models[name] = {
            "description": model["description"],
            "source": model["source"],
            "licenses": model["licenses"],
            "io": {"inputs": [{k: e[k] for k in ("name", "shape", "dtype")} for e in golden["inputs"]],
                   "outputs": [{k: e[k] for k in ("name", "shape", "dtype")}
                               for e in golden["outputs"]]},
            "static_model": {"sha256": sha256_file(ctx.input(f"{name}:static.onnx")),
                             "ops": static["ops"]},
            "artifacts": artifacts,
            "skipped": model["skipped"],  # ABI -> why this model is not built for it
            # shape variants (shapes.py): `shape_of`/`shape` on each, `shapes` on the model
            **{k: model[k] for k in ("shape_of", "shape", "shapes") if k in model},
        }
        if "variant_of" in model:  # a precision variant (pipeline/variants.py): IREE only
            _variant_fields(ctx, model, models[name])
            continue
        for abi in [a for a in cfg["target"].get("tvm_abis", []) if a["name"] in model.get("tvm_abis", [])]:
            artifacts[abi["name"]] = _tvm_artifact(ctx, f"{name}:{abi['name']}", abi)
        report = _json(ctx, f"{name}:coverage.json")
        models[name]["coverage"] = report["compilers"]  # per compiler: status, unsupported ops, basis
        models[name]["skipped"] = dict(sorted({
            **model["skipped"],
            **{abi: f"op coverage: {compiler.upper()} cannot take "
                    + ", ".join(sorted({u["op"] for u in entry["unsupported"]}))
               for compiler, entry in report["compilers"].items() if entry["status"] == "skipped"
               for abi in entry["abis"]}}.items()))
        if f"{name}:choice.json" in ctx.step.inputs:
            models[name]["choice"] = _choice(_json(ctx, f"{name}:choice.json"), artifacts)
    manifest = {"schema": SCHEMA, "target": {k: cfg["target"][k] for k in (
                    "name", "description", "definition_sha256", "fallback")},
                "models": models}
    if cfg["target"].get("ship"):
        manifest["target"]["ship"] = cfg["target"]["ship"]
    ctx.output("manifest.json").write_text(pretty_json(manifest))


def _validation(validation: dict, step: dict) -> dict:
    return {"status": validation["status"], "executed": validation["executed"],
            "shipped_bytes_executed": validation["shipped_bytes_executed"],
            "tolerance": validation["tolerance"], "outputs": validation["outputs"],
            "step_key": step["key"], "tools": step["key_parts"]["tools"]}


def _tvm_artifact(ctx, prefix: str, abi: dict) -> dict:
    """A TVM `.so` entry: the same shape as an IREE one, plus the TVM target and the tuning."""
    so = ctx.input(f"{prefix}:model.so")
    step = _json(ctx, f"{prefix}:compile.step")
    report = _json(ctx, f"{prefix}:compile.json")
    tools = step["key_parts"]["tools"]
    entry = {
        "path": ctx.step.layout.relative(so), "sha256": sha256_file(so), "size": so.stat().st_size,
        "format": "tvm-so", "entry": report["entry"], "abi": abi,
        "compile": {"step_key": step["key"], "flags": [], "target": report["target"],
                    "linker": report["linker"], "tools": tools},
        "requires": {"tvm_runtime": {"package": "apache-tvm", "version": tools["apache-tvm"],
                                     "ffi": tools["apache-tvm-ffi"],
                                     "install": f"pip install apache-tvm=={tools['apache-tvm']} "
                                                f"apache-tvm-ffi=={tools['apache-tvm-ffi']}",
                                     "libraries": "or only libtvm_runtime.so + libtvm_ffi.so "
                                                  "from that wheel (C++ loader)"}},
        "validation": _validation(_json(ctx, f"{prefix}:validation.json"),
                                  _json(ctx, f"{prefix}:validate.step")),
        "tuning": None,
    }
    if f"{prefix}:tune.json" in ctx.step.inputs:
        tune = _json(ctx, f"{prefix}:tune.json")
        entry["tuning"] = {"source": tune["source"], "pinned_at": tune.get("pinned_at"),
                           "trials_budget": tune["trials_budget"], "per_task": tune["per_task"],
                           "trials_spent": tune["trials_spent"], "tasks": len(tune["tasks"]),
                           "measured_on": tune["measured_on"],
                           "database_step_key": _json(ctx, f"{prefix}:tune.step")["key"]}
    return entry


def _choice(doc: dict, artifacts: dict) -> dict:
    """Per slot: what ships and why, with every candidate's figures."""
    out = {}
    for slot, entry in sorted(doc["slots"].items()):
        measured = {a["abi"]: a for a in (entry.get("measured") or {}).get("artifacts", [])}
        figures = {}
        for abi in entry["candidates"]:
            art = artifacts[abi]
            rows = art["validation"]["outputs"]
            figures[abi] = {"compiler": art["abi"]["compiler"], "format": art["format"],
                            "sha256": art["sha256"], "size": art["size"],
                            "validation": art["validation"]["status"],
                            "max_abs": max(r["max_abs"] for r in rows),
                            "min_cosine": min(r["cosine"] for r in rows),
                            "tuned": bool(art.get("tuning"))}
            if abi in measured:
                figures[abi]["host_proxy"] = {k: measured[abi][k] for k in ("proxy", "p50_ms", "min_ms")}
        out[slot] = {"ships": entry["ships"], "policy": entry["policy"], "reason": entry["reason"],
                     "candidates": figures, "skipped": entry["skipped"]}
    return out


# ----------------------------------------------------------------------------- steps
def steps(project) -> list:
    return [manifest_step(project, t) for t in project.targets]


def _artifact_inputs(inputs: dict, prefix: str, compiled: Path, checked: Path, artifact: str) -> None:
    inputs[f"{prefix}:{artifact}"] = compiled / artifact
    inputs[f"{prefix}:compile.json"] = compiled / "compile.json"
    inputs[f"{prefix}:compile.step"] = compiled / "step.json"
    inputs[f"{prefix}:validation.json"] = checked / "validation.json"
    inputs[f"{prefix}:validate.step"] = checked / "step.json"


def manifest_step(project, target) -> Step:
    layout, models = project.layout, project.models
    inputs = {}
    for model in models:
        inputs[f"{model.name}:static.json"] = layout.model_stage(model.name, "static") / "static.json"
        inputs[f"{model.name}:static.onnx"] = static_model(layout, model)
        inputs[f"{model.name}:golden.json"] = layout.model_stage(model.name, "golden") / "golden.json"
        for abi in [a for a in target.abis if built(project, model, target, a)]:
            _artifact_inputs(inputs, f"{model.name}:{abi.name}",
                             layout.artifact_stage(target.name, model.name, abi.name, "iree_compile"),
                             layout.artifact_stage(target.name, model.name, abi.name, "validate"),
                             "model.vmfb")
        inputs.update(_variant_inputs(layout, model, target))
        inputs[f"{model.name}:coverage.json"] = coverage_file(layout, target.name, model.name)
        if target.ship:
            inputs[f"{model.name}:choice.json"] = (layout.target_model_stage(
                target.name, model.name, "choose") / "choice.json")
        for abi in tvm_abis(project, model, target):
            prefix = f"{model.name}:{abi.name}"
            _artifact_inputs(inputs, prefix,
                             layout.artifact_stage(target.name, model.name, abi.name, "tvm_compile"),
                             layout.artifact_stage(target.name, model.name, abi.name, "validate"),
                             "model.so")
            if budget(model, target):
                tuned = layout.artifact_stage(target.name, model.name, abi.name, "tvm_tune")
                inputs[f"{prefix}:tune.json"] = tuned / "tune.json"
                inputs[f"{prefix}:tune.step"] = tuned / "step.json"
    models_cfg = [{"name": m.name, "description": m.description,
                   "source": {"file": m.source.name, "sha256": m.source_sha256,
                              **({"format": m.source_format, "route": ROUTES[m.source_format],
                                  "golden": GOLDEN[m.source_format]}
                                 if m.source_format != "onnx" else {})},
                   **({"shape_of": m.shape_of, "shape": m.shape} if m.shape_of else {}),
                   **({"shapes": list(m.shapes)} if m.shapes else {}),
                   "licenses": [p.name for p in m.licenses],
                   "skipped": {a.name: m.skip_reason(a.name) for a in target.all_abis
                               if m.skip_reason(a.name)},
                   "abis": [a.name for a in target.abis if built(project, m, target, a)],
                   "tvm_abis": [a.name for a in tvm_abis(project, m, target)]} for m in models]
    # precision variants are IREE-only: no TVM ABIs
    models_cfg += [{**v, "tvm_abis": []} for m in models for v in _variant_models(layout, m, target)]
    target_cfg = {"name": target.name, "description": target.description,
                  "definition_sha256": target.sha256, "fallback": list(target.fallback),
                  "abis": [{"name": a.name, **a.compile_config(), "run": a.run} for a in target.abis],
                  "tvm_abis": [{"name": a.name, **a.compile_config(), "run": a.run}
                               for a in target.tvm_abis],
                  "ship": [dict(s) for s in target.ship]}
    return Step(stage="manifest", name=target.name, version=VERSION,
                config={"target": target_cfg, "models": models_cfg}, inputs=inputs,
                outputs=OUTPUTS, out_dir=layout.root / target.name, tools=(),
                action=run, layout=layout, owns_dir=False,
                doc=f"artifacts/{target.name}/manifest.json: every validated artifact with its sha256",
                where={"target": target.name})


def _variant_inputs(layout, model, target) -> dict:
    """The files run() reads for the model's variants, under the fp32 entries' key names."""
    inputs = {}
    for v in model.variants:
        name = full_name(model, v)
        quantized = layout.model_stage(name, "quantize")
        inputs[f"{name}:static.json"] = quantized / "quantize.json"
        inputs[f"{name}:static.onnx"] = quantized / "model.onnx"
        inputs[f"{name}:golden.json"] = layout.model_stage(name, "golden") / "golden.json"
        inputs[f"{name}:accuracy.json"] = layout.model_stage(name, "accuracy") / "accuracy.json"
        for abi in target.abis:
            if variant_skip_reason(model, v, abi, layout.cache):
                continue
            _artifact_inputs(inputs, f"{name}:{abi.name}",
                             layout.artifact_stage(target.name, name, abi.name, "iree_compile"),
                             layout.artifact_stage(target.name, name, abi.name, "validate"),
                             "model.vmfb")
    return inputs


def _variant_models(layout, model, target) -> list[dict]:
    """The config entries of the model's variants (after every model's own)."""
    return [{"name": full_name(model, v),
             "description": f"{model.description} [{v.precision} variant {v.name!r}]",
             "source": {"file": model.source.name, "sha256": model.source_sha256},
             "licenses": [p.name for p in model.licenses],
             "skipped": {a.name: variant_skip_reason(model, v, a, layout.cache) for a in target.abis
                         if variant_skip_reason(model, v, a, layout.cache)},
             "variant_of": model.name, "precision": v.precision} for v in model.variants]


def _variant_fields(ctx, cfg: dict, entry: dict) -> None:
    """Complete a variant's manifest entry: what it is a variant of, how it was made, its gate."""
    name = cfg["name"]
    quantized = json.loads(ctx.input(f"{name}:static.json").read_text())
    gate = json.loads(ctx.input(f"{name}:accuracy.json").read_text())
    entry["variant_of"], entry["precision"] = cfg["variant_of"], cfg["precision"]
    entry["static_model"]["path"] = ctx.step.layout.relative(ctx.input(f"{name}:static.onnx"))
    entry["quantization"] = quantized["summary"]
    entry["accuracy"] = gate["summary"]
    for abi, art in entry["artifacts"].items():
        art["precision"] = cfg["precision"]
        validation = json.loads(ctx.input(f"{name}:{abi}:validation.json").read_text())
        art["validation"]["vs_fp32"] = validation["vs_fp32"]
