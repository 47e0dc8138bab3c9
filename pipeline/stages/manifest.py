"""Stage `manifest`: what ships for one target, every artifact with its sha256.

artifacts/<target>/manifest.json lists, per model: the source (file, sha256), the I/O contract
(names, shapes, dtypes of the compiled entry point), and per target ABI the artifact (path,
sha256, size), the compile step's key, flags (and the pinned config `doit search` chose, when a
pin names one) and tool versions, and how it was validated (what ran,
where, emulated or not, the error figures against the tolerance). Paths are relative to the
artifacts folder; there are no timestamps: the same build gives the same bytes.
A precision variant that passed its gate is an entry of its own, `<model>.<variant>`, with
variant_of, precision, quantization, accuracy and per artifact precision and validation.vs_fp32
(pipeline/spec/variants.py: manifest_fields), and whether it pays: per artifact `pays` (its p50
beside its fp32 build's and onnxruntime's on both models, measured by the variant's choose step,
stages/choose.py variant_step; or `measured: false` and why), in words as the entry's `pays`.

A model's `artifacts` holds every backend's builds (IREE's `.vmfb`, TVM's `.so`: `format` and
`abi.compiler` say which; `compile` and `requires` are the backend's, the `validation` shape is
the same, and a backend that tunes adds `tuning`: the database applied, or null);
`coverage` says per compiler whether it could take the model (and which ops it could not, how
that was checked); `skipped` maps each ABI left out to why (the spec's `skip:` reason, or op
coverage); `choice` says, per slot of the target, which artifact ships, by which policy and why,
with each candidate's figures.

A slot with a fallback (compilers/builds.py `fallback_pair`): the preferred's and the fallback's
artifacts are read through their validations' attempt records (graph/fallback.py), not as
inputs (one of them is not built). The one that did not ship is under `skipped` (the fallback,
not needed) or `failed` (the preferred: stage, error class, what, hint).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..compilers.backends import backend_named, backend_of
from ..compilers.builds import (attempt_file, built, fallback_pair, not_needed, read_attempt,
                                variant_abis, variant_skip_reason)
from ..compilers.coverage_table import manifest_table, rewrites_of
from ..core.layout import coverage_file, static_model
from ..core.numerics import worst_cosine
from ..core.steps import RECORD, StageConfig, Step, key_value
from ..core.store import pretty_json, sha256_file
from ..spec.sources import GOLDEN, ROUTES
from ..spec.tvm import budget
from ..spec.variants import PRECISIONS, full_name

VERSION = 2  # 2: TVM artifacts, coverage, skipped, choice
OUTPUTS = ("manifest.json",)
SCHEMA = "modelyard.manifest/1"


@dataclass(frozen=True)
class TargetEntry(StageConfig):
    """The target as the manifest describes it."""
    name: str
    description: str
    definition_sha256: str          # of the target's YAML
    fallback: tuple[str, ...]       # the order an app tries the ABIs in
    abis: tuple[dict, ...]          # every ABI: name, compile config (its `compiler`: the backend), run
    ship: tuple[dict, ...]          # the slots (choose.py)

    def problems(self):
        names = [a["name"] for a in self.abis]
        if len(set(names)) != len(names):
            yield f"ABI names must be unique within the target, got {', '.join(names)}"


@dataclass(frozen=True)
class ModelEntry(StageConfig):
    """A model (or a precision variant) as the manifest lists it for the target."""
    name: str
    description: str
    source: dict                    # file, sha256 (and format, route, golden for converted sources)
    licenses: tuple[str, ...]       # the license files' names
    skipped: dict                   # ABI -> why the spec leaves it out
    abis: tuple[str, ...] | None = None     # the ABIs it is built for (None: a variant's skips say)
    shape_of: str | None = None     # a shape variant: its model ...
    shape: str | None = None        # ... and its shape's name
    shapes: tuple[str, ...] = ()    # a model with shape variants: their names
    variant_of: str | None = None   # a precision variant: its model ...
    precision: str | None = None    # ... and its precision
    fallbacks: dict | None = None   # slot -> {preferred, fallback, why}: read through attempts

    def problems(self):
        if (self.shape_of is None) != (self.shape is None):
            yield f"{self.name}: shape_of and shape go together (a shape variant gives both)"
        if (self.variant_of is None) != (self.precision is None):
            yield f"{self.name}: variant_of and precision go together (a precision variant gives both)"
        elif self.precision is not None and (self.precision not in PRECISIONS or self.abis is not None):
            yield (f"{self.name}: a precision variant is int8 or fp16, of the backends that build "
                   f"variants, and its skips say its ABIs")

    def as_key(self) -> dict:
        key = {"name": self.name, "description": self.description, "source": key_value(self.source),
               "licenses": list(self.licenses), "skipped": key_value(self.skipped)}
        if self.abis is not None:
            key["abis"] = list(self.abis)
        if self.shape_of is not None:
            key.update(shape_of=self.shape_of, shape=self.shape)
        if self.shapes:
            key["shapes"] = list(self.shapes)
        if self.variant_of is not None:
            key.update(variant_of=self.variant_of, precision=self.precision)
        if self.fallbacks:
            key["fallbacks"] = key_value(self.fallbacks)
        return key


@dataclass(frozen=True)
class Config(StageConfig):
    target: TargetEntry
    models: tuple[ModelEntry, ...]  # the models, then their precision variants

    def problems(self):
        names = [m.name for m in self.models]
        if len(set(names)) != len(names):
            yield f"model names must be unique, got {', '.join(names)}"

    @classmethod
    def from_key(cls, key: dict) -> "Config":
        return cls(target=TargetEntry.from_key(key["target"]),
                   models=tuple(ModelEntry.from_key(m) for m in key["models"]))


def _json(ctx, name: str) -> dict:
    return json.loads(ctx.input(name).read_text())


def run(ctx) -> None:
    cfg = ctx.cfg
    layout = ctx.step.layout
    models, files_of = {}, {}
    for model in cfg.models:
        name = model.name
        static = _json(ctx, f"{name}:static.json")
        golden = _json(ctx, f"{name}:golden.json")
        artifacts, files, left, failed = {}, dict(ctx.step.inputs), {}, {}
        paired = {p[k]: p for p in (model.fallbacks or {}).values() for k in ("preferred", "fallback")}
        for abi in cfg.target.abis:
            if abi["name"] in model.skipped or abi["name"] not in _built(model, abi):
                continue
            prefix = f"{name}:{abi['name']}"
            if abi["name"] in paired:  # read through its attempt record
                attempt = read_attempt(ctx.input(f"{prefix}:attempt"))
                if attempt["status"] == "not-needed":
                    left[abi["name"]] = paired[abi["name"]]["why"]
                    continue
                if attempt["status"] == "failed":
                    failed[abi["name"]] = {k: attempt[k] for k in ("stage", "error_class", "what", "hint")}
                    continue
                files.update(_attempted_files(layout, cfg.target.name, name, abi, prefix))
            artifacts[abi["name"]] = _artifact(ctx, files, prefix, abi)
        files_of[name] = files
        models[name] = {
            "description": model.description,
            "source": model.source,
            "licenses": list(model.licenses),
            "io": {"inputs": [{k: e[k] for k in ("name", "shape", "dtype")} for e in golden["inputs"]],
                   "outputs": [{k: e[k] for k in ("name", "shape", "dtype")}
                               for e in golden["outputs"]]},
            "static_model": {"sha256": sha256_file(ctx.input(f"{name}:static.onnx")),
                             "ops": static["ops"]},
            # the static stage's graph surgery (pipeline/rewrite/static_rewrites.py): rule, nodes, why
            "static_rewrites": static.get("rewrites", []),
            # a cut detector's post-processing (spec postprocess), shipped beside the artifacts
            **({"postprocess": {**static["postprocess"], "sha256": sha256_file(
                ctx.input(f"{name}:postprocess.onnx"))}} if "postprocess" in static else {}),
            "artifacts": artifacts,
            "skipped": {**model.skipped, **left},  # ABI -> why this model is not built for it
            **({"failed": failed} if failed else {}),  # a preferred candidate that failed
            # shape variants (shapes.py): `shape_of`/`shape` on each, `shapes` on the model
            **{k: v for k, v in model.as_key().items() if k in ("shape_of", "shape", "shapes")},
        }
        if f"{name}:import.json" in ctx.step.inputs:  # what the import stage rewrote (tflite_rewrite)
            imported = _json(ctx, f"{name}:import.json")  # ... and the route it took (sources.to_onnx)
            models[name]["rewrites"] = imported.get("rewrites", [])
            models[name]["source"] = {**model.source, "route": imported["route"],
                                      "attempts": imported["attempts"]}
        if "reference" in golden:  # golden computed otherwise than plainly, and why (stages/golden.py)
            models[name]["golden"] = golden["reference"]
        if model.variant_of:  # a precision variant (pipeline/spec/variants.py)
            _variant_fields(ctx, model, models[name])
            continue
        report = _json(ctx, f"{name}:coverage.json")
        models[name]["coverage"] = report["compilers"]  # per compiler: status, unsupported ops, basis
        models[name]["skipped"] = dict(sorted({
            **model.skipped, **left,
            **{abi: f"op coverage: {compiler.upper()} cannot take "
                    + ", ".join(sorted({u["op"] for u in entry["unsupported"]}))
               for compiler, entry in report["compilers"].items() if entry["status"] == "skipped"
               for abi in entry["abis"]}}.items()))
        if f"{name}:choice.json" in ctx.step.inputs:
            models[name]["choice"] = _choice(_json(ctx, f"{name}:choice.json"), artifacts)
    manifest = {"schema": SCHEMA, "target": {k: v for k, v in cfg.target.as_key().items() if k in (
                    "name", "description", "definition_sha256", "fallback")},
                "models": models}
    if cfg.target.ship:
        manifest["target"]["ship"] = list(cfg.target.ship)
    manifest["coverage"] = _coverage_table(ctx, models, files_of)
    ctx.output("manifest.json").write_text(pretty_json(manifest))


def _coverage_table(ctx, models: dict, files_of: dict) -> dict:
    """The target's coverage table (pipeline/stages/coverage.py, also `doit coverage`): per model,
    the ABIs that shipped and the fallback flags a build needed (IREE's), the compilers coverage
    skipped and why, the rewrites import and static applied."""
    compiled, rewrites = {}, {}
    for name, entry in models.items():
        compiled[name] = {abi: json.loads(Path(files_of[name][f"{name}:{abi}:compile.json"]).read_text())
                          for abi in entry["artifacts"]}
        rewrites[name] = rewrites_of(*[(stage, _json(ctx, f"{name}:{stage}.json"))
                                       for stage in ("import", "static")
                                       if f"{name}:{stage}.json" in ctx.step.inputs])
    return manifest_table(models, compiled, rewrites)


def _built(model: ModelEntry, abi: dict) -> set:
    """The ABIs the model is built for: its own list, or (a precision variant) every ABI its
    skips leave, of the backends that build variants."""
    if model.abis is not None:
        return set(model.abis)
    return {abi["name"]} if backend_named(abi["compiler"]).variants else set()


def _attempted_files(layout, target: str, model: str, abi: dict, prefix: str) -> dict:
    """The files of a candidate read through its attempt record, under the inputs' names."""
    backend = backend_named(abi["compiler"])
    compiled = layout.artifact_stage(target, model, abi["name"], backend.compile_stage)
    checked = layout.artifact_stage(target, model, abi["name"], "validate")
    files: dict = {}
    _artifact_inputs(files, prefix, compiled, checked, backend.artifact)
    return files


def _artifact(ctx, files: dict, prefix: str, abi: dict) -> dict:
    """An artifact entry: its file, how it was compiled (its backend's fields), what it
    requires, how it was validated, and the tuning database applied (when one was)."""
    backend = backend_named(abi["compiler"])

    def read(name):
        return json.loads(Path(files[name]).read_text())
    path = Path(files[f"{prefix}:{backend.artifact}"])
    step = read(f"{prefix}:compile.step")
    report = read(f"{prefix}:compile.json")
    validation = read(f"{prefix}:validation.json")
    validate_step = read(f"{prefix}:validate.step")
    tools = step["key_parts"]["tools"]
    entry = {
        "path": ctx.step.layout.relative(path), "sha256": sha256_file(path),
        "size": path.stat().st_size, "format": backend.format, "entry": report["entry"], "abi": abi,
        "compile": {"step_key": step["key"], "tools": tools, **backend.compile_fields(report)},
        "requires": backend.requires(report, tools),
        "validation": {"status": validation["status"], "executed": validation["executed"],
                       "shipped_bytes_executed": validation["shipped_bytes_executed"],
                       **({"twin": validation["twin"]} if "twin" in validation else {}),
                       **{k: validation[k] for k in ("simulated", "tolerance_from", "also", "detections")
                          if k in validation},
                       "tolerance": validation["tolerance"], "outputs": validation["outputs"],
                       "step_key": validate_step["key"],
                       "tools": validate_step["key_parts"]["tools"]},
    }
    if backend.tune_stage is not None:  # the database applied, or None: untuned
        entry["tuning"] = None
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
                            "min_cosine": worst_cosine(rows),
                            "tuned": bool(art.get("tuning"))}
            if art["compile"].get("config"):  # the pinned config it was built with
                figures[abi]["config"] = art["compile"]["config"]["name"]
            if abi in measured:
                figures[abi]["host_proxy"] = {k: measured[abi][k] for k in ("proxy", "p50_ms", "min_ms")}
        out[slot] = {"ships": entry["ships"], "policy": entry["policy"], "reason": entry["reason"],
                     "candidates": figures, "skipped": entry["skipped"]}
        if entry.get("failed"):  # policy fallback: the preferred candidate's failure
            out[slot]["failed"] = entry["failed"]
    return out


# ----------------------------------------------------------------------------- steps
def steps(project) -> list:
    return [manifest_step(project, t) for t in project.targets]


def _artifact_inputs(inputs: dict, prefix: str, compiled: Path, checked: Path, artifact: str) -> None:
    inputs[f"{prefix}:{artifact}"] = compiled / artifact
    inputs[f"{prefix}:compile.json"] = compiled / "compile.json"
    inputs[f"{prefix}:compile.step"] = compiled / RECORD
    inputs[f"{prefix}:validation.json"] = checked / "validation.json"
    inputs[f"{prefix}:validate.step"] = checked / RECORD


def manifest_step(project, target) -> Step:
    layout, models = project.layout, project.models
    inputs = {}
    for model in models:
        inputs[f"{model.name}:static.json"] = layout.model_stage(model.name, "static") / "static.json"
        inputs[f"{model.name}:static.onnx"] = static_model(layout, model)
        if model.postprocess:  # a cut detector's post-processing (static stage), shipped
            inputs[f"{model.name}:postprocess.onnx"] = static_model(layout, model).with_name("postprocess.onnx")
        inputs[f"{model.name}:golden.json"] = layout.model_stage(model.name, "golden") / "golden.json"
        if model.source_format != "onnx":  # a converted source: the rewrites of its graph
            inputs[f"{model.name}:import.json"] = layout.model_stage(model.base, "import") / "import.json"
        pairs = _pairs(project, model, target)
        paired = {p[k] for p in pairs.values() for k in ("preferred", "fallback")}
        for abi in [a for a in target.abis if built(project, model, target, a)]:
            backend, prefix = backend_of(abi), f"{model.name}:{abi.name}"
            if abi.name in paired:  # its attempt record: the artifact may not be built
                inputs[f"{prefix}:attempt"] = attempt_file(layout, target.name, model.name,
                                                           abi.name, "validate")
                continue
            _artifact_inputs(inputs, prefix,
                             layout.artifact_stage(target.name, model.name, abi.name, backend.compile_stage),
                             layout.artifact_stage(target.name, model.name, abi.name, "validate"),
                             backend.artifact)
            if backend.tune_stage is not None and budget(model, target):
                tuned = layout.artifact_stage(target.name, model.name, abi.name, backend.tune_stage)
                inputs[f"{prefix}:tune.json"] = tuned / "tune.json"
                inputs[f"{prefix}:tune.step"] = tuned / RECORD
        inputs.update(_variant_inputs(layout, model, target))
        inputs[f"{model.name}:coverage.json"] = coverage_file(layout, target.name, model.name)
        if target.ship:
            inputs[f"{model.name}:choice.json"] = (layout.target_model_stage(
                target.name, model.name, "choose") / "choice.json")
    entries = [ModelEntry(name=m.name, description=m.description,
                          source={"file": m.source.name, "sha256": m.source_sha256,
                                  **({"format": m.source_format, "routes": list(ROUTES[m.source_format]),
                                      "golden": GOLDEN[m.source_format]}
                                     if m.source_format != "onnx" else {})},
                          shape_of=m.shape_of, shape=m.shape if m.shape_of else None,
                          shapes=tuple(m.shapes),
                          licenses=tuple(p.name for p in m.licenses),
                          skipped={a.name: m.skip_reason(a.name) or not_needed(project, m, target, a)
                                   for a in target.abis
                                   if m.skip_reason(a.name) or not_needed(project, m, target, a)},
                          abis=tuple(a.name for a in target.abis if built(project, m, target, a)),
                          fallbacks=_pairs(project, m, target) or None)
               for m in models]
    entries += [v for m in models for v in _variant_models(layout, m, target)]
    target_entry = TargetEntry(
        name=target.name, description=target.description, definition_sha256=target.sha256,
        fallback=tuple(target.fallback),
        abis=tuple({"name": a.name, **a.compile_config(), "run": a.run} for a in target.abis),
        ship=tuple(dict(s) for s in target.ship))
    return Step(stage="manifest", name=target.name, version=VERSION,
                config=Config(target=target_entry, models=tuple(entries)), inputs=inputs,
                outputs=OUTPUTS, out_dir=layout.target_dir(target.name), tools=(),
                action=run, layout=layout, owns_dir=False,
                doc=f"artifacts/{target.name}/manifest.json: every validated artifact with its sha256",
                where={"target": target.name})


def _pairs(project, model, target) -> dict:
    """slot -> {preferred, fallback, why} of the target's slots with a fallback for the model."""
    pairs = {s["name"]: fallback_pair(project, model, target, s) for s in target.ship}
    return {k: v for k, v in pairs.items() if v}


def _variant_inputs(layout, model, target) -> dict:
    """The files run() reads for the model's variants, under the fp32 entries' key names."""
    inputs = {}
    for v in model.variants:
        name = full_name(model, v)
        if any(not variant_skip_reason(model, v, a, layout.cache) for a in variant_abis(target)):
            inputs[f"{name}:choice.json"] = (layout.target_model_stage(target.name, name, "choose")
                                             / "choice.json")
        quantized = layout.model_stage(name, "quantize")
        inputs[f"{name}:static.json"] = quantized / "quantize.json"
        inputs[f"{name}:static.onnx"] = quantized / "model.onnx"
        inputs[f"{name}:golden.json"] = layout.model_stage(name, "golden") / "golden.json"
        inputs[f"{name}:accuracy.json"] = layout.model_stage(name, "accuracy") / "accuracy.json"
        for abi in variant_abis(target):
            if variant_skip_reason(model, v, abi, layout.cache):
                continue
            backend = backend_of(abi)
            _artifact_inputs(inputs, f"{name}:{abi.name}",
                             layout.artifact_stage(target.name, name, abi.name, backend.compile_stage),
                             layout.artifact_stage(target.name, name, abi.name, "validate"),
                             backend.artifact)
    return inputs


def _variant_models(layout, model, target) -> list[ModelEntry]:
    """The config entries of the model's variants (after every model's own): the ABIs of the
    backends that build variants."""
    return [ModelEntry(name=full_name(model, v),
                       description=f"{model.description} [{v.precision} variant {v.name!r}]",
                       source={"file": model.source.name, "sha256": model.source_sha256},
                       licenses=tuple(p.name for p in model.licenses),
                       skipped={a.name: variant_skip_reason(model, v, a, layout.cache)
                                for a in variant_abis(target)
                                if variant_skip_reason(model, v, a, layout.cache)},
                       variant_of=model.name, precision=v.precision)
            for v in model.variants]


def _variant_fields(ctx, cfg: ModelEntry, entry: dict) -> None:
    """Complete a variant's manifest entry: what it is a variant of, how it was made, its gate."""
    name = cfg.name
    quantized = json.loads(ctx.input(f"{name}:static.json").read_text())
    gate = json.loads(ctx.input(f"{name}:accuracy.json").read_text())
    entry["variant_of"], entry["precision"] = cfg.variant_of, cfg.precision
    entry["static_model"]["path"] = ctx.step.layout.relative(ctx.input(f"{name}:static.onnx"))
    entry["quantization"] = quantized["summary"]
    entry["accuracy"] = gate["summary"]
    for abi, art in entry["artifacts"].items():
        art["precision"] = cfg.precision
        validation = json.loads(ctx.input(f"{name}:{abi}:validation.json").read_text())
        art["validation"]["vs_fp32"] = validation["vs_fp32"]
    if f"{name}:choice.json" in ctx.step.inputs:  # choose.variant_step: timed beside fp32
        choice = json.loads(ctx.input(f"{name}:choice.json").read_text())
        entry["pays"] = choice["reason"]  # per ABI in words; the figures under artifacts[abi].pays
        for abi, art in entry["artifacts"].items():
            art["pays"] = choice["pays"][abi]
