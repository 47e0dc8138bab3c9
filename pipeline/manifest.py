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

from .store import pretty_json, sha256_file

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
            from .variants import manifest_fields
            manifest_fields(ctx, model, models[name])
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
