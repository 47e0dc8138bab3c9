"""Stage `import`: read the source model, check it with onnx.checker, normalise its opset.

(The module is not called import.py: `import` is a Python keyword.)
Opsets below the spec's `opset` (default 17) are upgraded with onnx.version_converter (old
PaddlePaddle exports at opset 11 need it before IREE takes them); newer opsets are kept as
they are, never downgraded.
"""
from __future__ import annotations

import collections
import json
from ..spec.sources import ROUTES
from ..spec.sources import TOOLS as SOURCE_TOOLS
from ..core.steps import Step
from ..spec.sources import source_files

VERSION = 2  # 2: TFLite route folds shape ops, restores I/O names (nnef_fixes, sources)
OUTPUTS = ("model.onnx", "import.json")


def main_opset(model) -> int:
    return max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)


def run(ctx) -> None:
    import onnx
    from onnx import version_converter

    fmt = ctx.config.get("format", "onnx")
    source = ctx.input("source") if fmt == "onnx" else None
    if fmt != "onnx":
        source = _convert(ctx, fmt)
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
    wanted = ctx.config["opset"]
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
    report = {**({"format": fmt, "route": ctx.config["route"]} if fmt != "onnx" else {}),
              "source_opset": source_opset, "opset": main_opset(model),
              "ir_version": model.ir_version, "producer": model.producer_name,
              "graph_name": model.graph.name, "nodes": len(model.graph.node),
              "ops": dict(sorted(ops.items()))}
    ctx.output("import.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")


def _convert(ctx, fmt: str):
    """A TFLite file or NNEF folder -> ONNX in the scratch folder (sources.py), interface checked."""
    from . import sources
    from ..spec.model import read_signature
    if ctx.config.get("custom_ops"):
        raise ctx.error(f"the TFLite model uses custom op(s) {', '.join(ctx.config['custom_ops'])}: "
                        f"neither the LiteRT builtin interpreter (golden) nor nnef-tools (the route "
                        f"to ONNX) can run or convert them",
                        hint="re-export the model with builtin TFLite ops only (or replace those ops)")
    source = ctx.input(f"source:{sources.NNEF_GRAPH}").parent if fmt == "nnef" else ctx.input("source")
    converted = ctx.output("model.onnx")  # rewritten below once checked and opset-normalised
    try:
        sources.to_onnx(source, fmt, converted, log=ctx.log)
    except sources.ConversionError as exc:
        raise ctx.error(f"{ctx.config['route']} failed: {exc}", log=True,
                        hint="an op nnef-tools cannot convert needs a custom converter in "
                             "pipeline/nnef_fixes.py, or a re-export of the model")
    mismatch = sources.io_mismatches(ctx.config["io"], read_signature(converted))
    if mismatch:
        raise ctx.error(f"the converted model's interface differs from the {fmt} source: "
                        f"{'; '.join(mismatch)}", hint="report it; the conversion route changed the model")
    return converted


# ----------------------------------------------------------------------------- steps
def steps(project) -> list:
    """One import per source: a shape variant shares its model's."""
    return [import_step(project.layout, m) for m in project.models if not m.shape_of]


def import_step(layout, model) -> Step:
    config = {"opset": model.opset}
    if model.source_format != "onnx":  # converted to ONNX first (sources.py); ONNX keys unchanged
        config.update(format=model.source_format, route=ROUTES[model.source_format],
                      io={k: model.signature[k] for k in ("inputs", "outputs")},
                      custom_ops=model.signature.get("custom_ops", []))
    return Step(stage="import", name=model.name, version=VERSION,
                config=config, inputs=source_files(model.source),
                outputs=OUTPUTS, out_dir=layout.model_stage(model.name, "import"),
                tools=("onnx",) + SOURCE_TOOLS[model.source_format], action=run,
                layout=layout,
                doc=f"check {model.source.name} and normalise it to opset >= {model.opset}",
                where={"model": model.name})
