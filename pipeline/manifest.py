"""Stage `manifest`: what ships for one target, every artifact with its sha256.

artifacts/<target>/manifest.json lists, per model: the source (file, sha256), the I/O contract
(names, shapes, dtypes of the compiled entry point), and per target ABI the artifact (path,
sha256, size), the compile step's key and tool versions, and how it was validated (what ran,
where, emulated or not, the error figures against the tolerance). Paths are relative to the
artifacts folder; there are no timestamps: the same build gives the same bytes.
A precision variant that passed its gate is an entry of its own, `<model>.<variant>`, with
variant_of, precision, quantization, accuracy and per artifact precision and validation.vs_fp32
(pipeline/variants.py: manifest_fields).
"""
from __future__ import annotations

import json

from .store import pretty_json, sha256_file

VERSION = 1
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
        for abi in cfg["target"]["abis"]:
            if abi["name"] in model["skipped"]:
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
        if "variant_of" in model:  # a precision variant (pipeline/variants.py)
            from .variants import manifest_fields
            manifest_fields(ctx, model, models[name])
    manifest = {"schema": SCHEMA, "target": {k: cfg["target"][k] for k in (
                    "name", "description", "definition_sha256", "fallback")},
                "models": models}
    ctx.output("manifest.json").write_text(pretty_json(manifest))
