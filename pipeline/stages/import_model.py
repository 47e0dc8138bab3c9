"""Stage `import`: read the source model, check it with onnx.checker, normalise its opset.

(The module is not called import.py: `import` is a Python keyword.)
Opsets below the spec's `opset` (default 17) are upgraded with onnx.version_converter (old
PaddlePaddle exports at opset 11 need it before IREE takes them); newer opsets are kept as
they are, never downgraded.
"""
from __future__ import annotations

import collections
from dataclasses import dataclass

from ..core.steps import StageConfig, Step, key_value
from ..core.store import pretty_json
from ..spec.sources import NNEF_GRAPH, ROUTES, source_files
from ..spec.sources import TOOLS as SOURCE_TOOLS

VERSION = 2  # 2: TFLite route folds shape ops, restores I/O names (nnef_fixes, sources)
OUTPUTS = ("model.onnx", "import.json")


@dataclass(frozen=True)
class Config(StageConfig):
    opset: int                        # the opset the model is raised to (never lowered)
    format: str = "onnx"              # the source's format: onnx | tflite | nnef
    route: str | None = None          # a converted source: how it becomes ONNX (ROUTES)
    io: dict | None = None            # ... and its inputs/outputs, which the conversion must keep
    custom_ops: tuple[str, ...] = ()  # ... and its TFLite custom ops (none can be converted)

    def problems(self):
        if isinstance(self.opset, bool) or not isinstance(self.opset, int) or self.opset < 1:
            yield f"opset must be a positive integer, got {self.opset!r}"
        if self.format not in ROUTES:
            yield f"format must be one of {', '.join(ROUTES)}, got {self.format!r}"
        elif self.format == "onnx" and (self.route or self.io or self.custom_ops):
            yield "an ONNX source is not converted: route, io and custom_ops are for TFLite and NNEF sources"
        elif self.format != "onnx" and (self.route != ROUTES[self.format] or self.io is None):
            yield f"a {self.format} source needs route {ROUTES[self.format]!r} and the io it must keep"

    def as_key(self) -> dict:
        key = {"opset": self.opset}
        if self.format != "onnx":  # converted to ONNX first (sources.py); ONNX keys unchanged
            key.update(format=self.format, route=self.route, io=key_value(self.io),
                       custom_ops=list(self.custom_ops))
        return key


def main_opset(model) -> int:
    return max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)


def run(ctx) -> None:
    import onnx
    from onnx import version_converter

    cfg = ctx.cfg
    fmt = cfg.format
    source = ctx.input("source") if fmt == "onnx" else _convert(ctx, cfg)
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
    report = {**({"format": fmt, "route": cfg.route} if fmt != "onnx" else {}),
              "source_opset": source_opset, "opset": main_opset(model),
              "ir_version": model.ir_version, "producer": model.producer_name,
              "graph_name": model.graph.name, "nodes": len(model.graph.node),
              "ops": dict(sorted(ops.items()))}
    ctx.output("import.json").write_text(pretty_json(report))


def _convert(ctx, cfg: Config):
    """A TFLite file or NNEF folder -> ONNX in the scratch folder (sources.py), interface checked."""
    from . import sources
    from ..spec.model import read_signature
    fmt = cfg.format
    if cfg.custom_ops:
        raise ctx.error(f"the TFLite model uses custom op(s) {', '.join(cfg.custom_ops)}: "
                        f"neither the LiteRT builtin interpreter (golden) nor nnef-tools (the route "
                        f"to ONNX) can run or convert them",
                        hint="re-export the model with builtin TFLite ops only (or replace those ops)")
    source = ctx.input(f"source:{NNEF_GRAPH}").parent if fmt == "nnef" else ctx.input("source")
    converted = ctx.output("model.onnx")  # rewritten below once checked and opset-normalised
    try:
        sources.to_onnx(source, fmt, converted, log=ctx.log)
    except sources.ConversionError as exc:
        raise ctx.error(f"{cfg.route} failed: {exc}", log=True,
                        hint="an op nnef-tools cannot convert needs a custom converter in "
                             "pipeline/stages/nnef_fixes.py, or a re-export of the model")
    mismatch = sources.io_mismatches(cfg.io, read_signature(converted))
    if mismatch:
        raise ctx.error(f"the converted model's interface differs from the {fmt} source: "
                        f"{'; '.join(mismatch)}", hint="report it; the conversion route changed the model")
    return converted


# ----------------------------------------------------------------------------- steps
def steps(project) -> list:
    """One import per source: a shape variant shares its model's."""
    return [import_step(project.layout, m) for m in project.models if not m.shape_of]


def import_step(layout, model) -> Step:
    fmt = model.source_format
    config = Config(opset=model.opset) if fmt == "onnx" else Config(
        opset=model.opset, format=fmt, route=ROUTES[fmt],
        io={k: model.signature[k] for k in ("inputs", "outputs")},
        custom_ops=tuple(model.signature.get("custom_ops", [])))
    return Step(stage="import", name=model.name, version=VERSION,
                config=config, inputs=source_files(model.source),
                outputs=OUTPUTS, out_dir=layout.model_stage(model.name, "import"),
                tools=("onnx",) + SOURCE_TOOLS[model.source_format], action=run,
                layout=layout,
                doc=f"check {model.source.name} and normalise it to opset >= {model.opset}",
                where={"model": model.name})
