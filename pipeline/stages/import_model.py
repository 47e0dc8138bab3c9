"""Stage `import`: read the source model, check it with onnx.checker, normalise its opset.

(The module is not called import.py: `import` is a Python keyword.)
Opsets below the spec's `opset` (default 17) are upgraded with onnx.version_converter (old
PaddlePaddle exports at opset 11 need it before IREE takes them); newer opsets are kept as
they are, never downgraded.

The source is read once: its files (an ONNX file and its external data, a TFLite file, an NNEF
folder) are copied into the scratch folder, hashed as they are copied, and must have the
spec's sha256; the copy is what is loaded or converted. The spec checked that sha256 when it was
loaded, but a file can change since (a `git pull` during the build): without this, a manifest
could list the new sha256 over artifacts built from the old bytes.
"""
from __future__ import annotations

import collections
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ..core.steps import DISK_FULL, StageConfig, Step, key_value
from ..core.store import pretty_json
from ..rewrite import sources
from ..rewrite.graph_edit import main_opset
from ..spec.model import read_signature
from ..spec.sources import ROUTES, files_sha256, source_files
from ..spec.sources import TOOLS as SOURCE_TOOLS

VERSION = 3  # 2: TFLite route folds shape ops, restores I/O names; 3: routes tried in order, recorded
OUTPUTS = ("model.onnx", "import.json")
CHANGED_HINT = ("a file of the model's folder changed during the build (a `git pull`?): run the "
                "build again; if the new bytes are meant, put their sha256 in source.sha256 of "
                "the model's model.yaml (a spec error prints it)")


@dataclass(frozen=True)
class Config(StageConfig):
    opset: int                        # the opset the model is raised to (never lowered)
    format: str = "onnx"              # the source's format: onnx | tflite | nnef
    routes: tuple[str, ...] = ()      # a converted source: the routes into ONNX, tried in order (ROUTES)
    io: dict | None = None            # ... and its inputs/outputs, which the conversion must keep
    custom_ops: tuple[str, ...] = ()  # ... and its TFLite custom ops (known ones are rewritten: tflite_rewrite.py)
    source_sha256: str | None = None  # the spec's pin: the bytes read must have it (import_step sets it)
    check_shapes: dict | None = None  # ... with dynamic input dims: the spec's shapes, checked at (to_onnx)

    def problems(self):
        if isinstance(self.opset, bool) or not isinstance(self.opset, int) or self.opset < 1:
            yield f"opset must be a positive integer, got {self.opset!r}"
        if self.source_sha256 is not None and not re.fullmatch(r"[0-9a-f]{64}", str(self.source_sha256)):
            yield f"source_sha256 must be 64 lower-case hex digits, got {self.source_sha256!r}"
        if self.format not in ROUTES:
            yield f"format must be one of {', '.join(ROUTES)}, got {self.format!r}"
        elif self.format == "onnx" and (self.routes or self.io or self.custom_ops):
            yield "an ONNX source is not converted: routes, io and custom_ops are for TFLite and NNEF sources"
        elif self.format != "onnx" and (tuple(self.routes) != ROUTES[self.format] or self.io is None):
            yield f"a {self.format} source needs routes {ROUTES[self.format]!r} and the io it must keep"

    def as_key(self) -> dict:
        key = {"opset": self.opset}
        if self.format != "onnx":  # converted to ONNX first (sources.py)
            key.update(format=self.format, routes=list(self.routes), io=key_value(self.io),
                       custom_ops=list(self.custom_ops))
        if self.source_sha256 is not None:
            key["source_sha256"] = self.source_sha256
        if self.check_shapes:
            key["check_shapes"] = key_value(self.check_shapes)
        return key


def run(ctx) -> None:
    import onnx  # onnx: 1.5 s, not needed by doit list
    from onnx import version_converter  # onnx: 1.5 s, not needed by doit list

    cfg = ctx.cfg
    fmt = cfg.format
    copy = read_source(ctx)
    source, conversion = (copy, None) if fmt == "onnx" else _convert(ctx, cfg, copy)
    try:
        model = onnx.load(str(source))
    except Exception as exc:
        raise ctx.error(f"{source.name} is not a readable ONNX model: {str(exc).splitlines()[0]}",
                        hint="check that source.path points at the .onnx file itself")
    if model.ir_version <= 0 or not model.graph.node:
        raise ctx.error(f"{source.name} holds no ONNX graph (ir_version or nodes missing)",
                        hint="check that source.path points at the .onnx file itself")
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:
        raise ctx.error(f"onnx.checker rejects {source.name}: {str(exc).splitlines()[0]}",
                        hint="re-export the model with a current exporter")
    source_opset = main_opset(model)
    wanted = cfg.opset
    if source_opset < wanted:
        try:
            model = version_converter.convert_version(model, wanted)
            onnx.checker.check_model(model)
        except Exception as exc:
            raise ctx.error(f"cannot convert opset {source_opset} -> {wanted}: "
                            f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}",
                            hint="set `opset:` in the model spec to a version the converter reaches")
    ops = collections.Counter(
        (n.domain or "ai.onnx") + "::" + n.op_type if n.domain not in ("", "ai.onnx") else n.op_type
        for n in model.graph.node)
    ctx.output("model.onnx").write_bytes(model.SerializeToString(deterministic=True))
    report = {**({"format": fmt, "route": conversion["route"], "attempts": conversion["attempts"]}
                 if conversion is not None else {}),
              "source_opset": source_opset, "opset": main_opset(model),
              "ir_version": model.ir_version, "producer": model.producer_name,
              "graph_name": model.graph.name, "nodes": len(model.graph.node),
              "ops": dict(sorted(ops.items()))}
    if conversion is not None:  # a converted source: the checked rewrites of its graph (tflite_rewrite)
        report["rewrites"] = conversion["rewrites"]
    ctx.output("import.json").write_text(pretty_json(report))


def read_source(ctx) -> Path:
    """Copy the source's files (the step's inputs) into scratch/source/, hashing the very bytes
    copied, and check them against the spec's pin; returns the copy to load or convert (an ONNX
    file beside its external data, a TFLite file, an NNEF folder)."""
    pin = ctx.cfg.source_sha256
    if pin is None:
        raise ValueError(f"import step {ctx.step.name} has no source_sha256 to check the source "
                         f"against")  # a bug: import_step always sets it
    dest, hashes, root = ctx.scratch / "source", {}, None
    for name, path in sorted(ctx.step.inputs.items()):
        path = Path(path)
        if name == "source":  # a file, with an ONNX file's external data beside it
            copy = root = dest / path.name
        else:                 # source:<path in an NNEF folder, or an external-data location>
            rel = PurePosixPath(name.split(":", 1)[1])
            if ctx.cfg.format == "nnef":
                folder = path
                for _ in rel.parts:
                    folder = folder.parent
                root = dest / folder.name
                copy = root / rel
            else:
                copy = dest / rel
        try:
            hashes[name] = _copy_hashing(path, copy)
        except OSError as exc:
            if exc.errno in DISK_FULL:
                raise  # the copy could not be written: a full disk, said as such (steps.py)
            raise ctx.error(f"cannot read the source file {path}: {exc.strerror}",
                            hint=CHANGED_HINT) from None
    actual = files_sha256(hashes)
    if actual != pin:
        files = (f"{root.name}/, {len(hashes)} files" if ctx.cfg.format == "nnef" else
                 ", ".join(PurePosixPath(n.split(":", 1)[1]).as_posix() if ":" in n else root.name
                           for n in sorted(hashes)))
        raise ctx.error(f"the source changed after the specs were read: the bytes read now "
                        f"({files}) have sha256 {actual}, the spec pins {pin}; nothing was built "
                        f"from them", hint=CHANGED_HINT)
    return root


def _copy_hashing(source: Path, dest: Path) -> str:
    """Copy a file, returning the sha256 of the bytes written (read once, never memoised)."""
    h = hashlib.sha256()
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(source, "rb") as src, open(dest, "xb") as out:
        while chunk := src.read(1 << 20):
            h.update(chunk)
            out.write(chunk)
    return h.hexdigest()


def _convert(ctx, cfg: Config, source: Path):
    """A TFLite file or NNEF folder (the checked copy) -> ONNX in the scratch folder (sources.py:
    each route of cfg.routes in order, the first that converts and matches LiteRT used),
    interface checked. Returns (the ONNX file, the conversion's record: route, attempts, rewrites)."""
    fmt = cfg.format
    converted = ctx.output("model.onnx")  # rewritten below once checked and opset-normalised
    try:  # a TFLite source's custom ops: rewritten into builtins where a rule knows them (tflite_rewrite)
        conversion = sources.to_onnx(source, fmt, converted, log=ctx.log, check_shapes=cfg.check_shapes)
    except sources.ConversionError as exc:
        if cfg.custom_ops and str(exc).startswith("custom op"):  # refused before any route (tflite_rewrite)
            raise ctx.error(f"the TFLite model uses {exc}", hint="re-export the model with builtin TFLite "
                            "ops only (or add a rewrite rule to pipeline/rewrite/tflite_rewrite.py)")
        raise ctx.error(f"no route converts the {fmt} source ({', '.join(cfg.routes)}): {exc}", log=True,
                        hint="an op a route refuses needs a converter: a custom one in "
                             "pipeline/rewrite/nnef_fixes.py (nnef-tools) or an op_<NAME> method in "
                             "pipeline/rewrite/tflite_onnx.py; or re-export the model")
    mismatch = sources.io_mismatches(cfg.io, read_signature(converted))
    if mismatch:
        raise ctx.error(f"the converted model's interface differs from the {fmt} source "
                        f"({conversion['route']}): {'; '.join(mismatch)}",
                        hint="report it; the conversion route changed the model")
    return converted, conversion


# ----------------------------------------------------------------------------- steps
def steps(project) -> list:
    """One import per source: a shape variant shares its model's."""
    return [import_step(project.layout, m) for m in project.models if not m.shape_of]


def import_step(layout, model) -> Step:
    fmt = model.source_format
    config = Config(opset=model.opset, source_sha256=model.source_sha256) if fmt == "onnx" else Config(
        opset=model.opset, format=fmt, routes=ROUTES[fmt],
        io={k: model.signature[k] for k in ("inputs", "outputs")},
        custom_ops=tuple(model.signature.get("custom_ops", [])), source_sha256=model.source_sha256,
        check_shapes={i.name: list(i.shape) for i in model.inputs} if any(
            d is None for i in model.signature["inputs"] for d in i["dims"]) else None)
    return Step(stage="import", name=model.name, version=VERSION,  # inputs: every file of the source
                config=config, inputs=source_files(model.source, model.external_data),
                outputs=OUTPUTS, out_dir=layout.model_stage(model.name, "import"),
                tools=("onnx",) + SOURCE_TOOLS[model.source_format], action=run,
                layout=layout,
                doc=f"check {model.source.name} and normalise it to opset >= {model.opset}",
                where={"model": model.name})
