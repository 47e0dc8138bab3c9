"""Stage `quantize`: the fp32 static model -> a reduced-precision model (one variant).

int8: onnxruntime static quantization in QDQ format (QuantizeLinear/DequantizeLinear around
      standard ops: the only form IREE and TVM compile; QOperator's com.microsoft ops fail),
      int8 activations and weights, calibrated on the variant's calibration samples with MinMax,
      Entropy or Percentile, per-tensor or per-channel weights, `exclude_nodes` left in fp32.
fp16: onnxruntime's float16 converter; inputs/outputs stay float32 unless io_dtype says
      float16; the Cast nodes it inserts (graph boundary, around excluded nodes) are recorded.

quantize.json: what was done (`summary`, copied into the manifest), the ops of the result
(`ops`), the calibration set (files, sha256), the Casts. int8 also writes calibration.json:
the range of every calibrated tensor (onnxruntime's calibration cache format). Errors name the
model.variant and say which sample, node or op is at fault.
"""
from __future__ import annotations

import collections
import contextlib
import io
import json
import logging
from ..core.steps import Step
from ..spec.variants import full_name
from .plan import static_model, variant_inputs, variant_preprocessing, variant_tools

VERSION = 1
OUTPUTS = {"int8": ("model.onnx", "quantize.json", "calibration.json"),
           "fp16": ("model.onnx", "quantize.json")}
_METHODS = {"minmax": "MinMax", "entropy": "Entropy", "percentile": "Percentile"}
# Histogram sizes: Entropy searches thresholds over 2048 bins for 128 quantized levels (as
# TensorRT does); Percentile takes onnxruntime's 2048 bins.
_CALIBRATOR_OPTIONS = {"minmax": {}, "entropy": {"num_bins": 2048, "num_quantized_bins": 128},
                       "percentile": {"num_bins": 2048}}


@contextlib.contextmanager
def _quiet(log):
    """onnxruntime's quantizer prints and logs warnings (pre-processing advice, histogram
    progress): into the step's log, not the build's output."""
    import onnxruntime as ort
    ort.set_default_logger_severity(3)
    out = io.StringIO()
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with contextlib.redirect_stdout(out):
            yield
    finally:
        logging.disable(previous)
        with open(log, "a") as f:
            f.write(out.getvalue())


def load_data(ctx, kind_key: str = "calibration") -> list[dict]:
    """The data set's samples as model inputs; a bad sample is an error naming its file."""
    from ..spec.calibration import Preprocessing, SampleError, load_sample
    data = ctx.config[kind_key]
    pre = {k: Preprocessing.from_dict(v) for k, v in ctx.config["preprocessing"].items()}
    samples = []
    for name in data["files"]:
        try:
            samples.append(load_sample(ctx.input(f"{kind_key}:{name}"), data["kind"],
                                       ctx.config["inputs"], pre))
        except SampleError as exc:
            raise ctx.error(f"{kind_key} sample {exc}",
                            hint=f"fix or remove that file from the {kind_key} folder (every "
                                 f"sample must become the model's input: see `preprocessing:`)")
    if not samples:
        raise ctx.error(f"the {kind_key} set is empty", hint="add samples to its folder")
    return samples


def _check_nodes(ctx, model, names: list[str]) -> None:
    present = {n.name for n in model.graph.node}
    unknown = [n for n in names if n not in present]
    if unknown:
        shown = ", ".join(sorted(present)[:12])
        raise ctx.error(f"exclude_nodes: no node named {', '.join(map(repr, unknown))} in the "
                        f"static model (it has {len(present)} nodes, e.g. {shown})",
                        hint="take node names from the divergence table (doit accuracy) or from "
                             "artifacts/models/<model>/static/model.onnx")


def constants_to_initializers(model) -> int:
    """Constant nodes holding a tensor become initializers (PaddlePaddle exports keep weights as
    Constant nodes, which onnxruntime would quantize as calibrated activations: no symmetric or
    per-channel weights). Returns how many were moved."""
    moved = []
    for node in model.graph.node:
        if node.op_type == "Constant" and len(node.attribute) == 1 and node.attribute[0].name == "value":
            tensor = node.attribute[0].t
            tensor.name = node.output[0]
            model.graph.initializer.append(tensor)
            moved.append(node)
    for node in moved:
        model.graph.node.remove(node)
    return len(moved)


def _int8(ctx, model, out_path) -> dict:
    """Calibrate (our own calibrator call, so that every method gets its parameters: through
    quantize_static, onnxruntime 1.32 runs Entropy with 128 bins for 128 quantized bins, i.e.
    MinMax), keep the ranges as calibration.json, then quantize with exactly those ranges."""
    import onnx
    from onnxruntime.quantization import (CalibrationDataReader, CalibrationMethod, QuantFormat,
                                          QuantType, create_calibrator, quantize_static,
                                          save_tensors_data)
    from onnxruntime.quantization.registry import QDQRegistry, QLinearOpsRegistry
    cfg = ctx.config
    samples = load_data(ctx)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(samples)

        def get_next(self):
            return next(self.it, None)

    moved = constants_to_initializers(model)
    fp32 = ctx.scratch / "fp32.onnx"
    onnx.save(model, str(fp32))
    method = getattr(CalibrationMethod, _METHODS[cfg["method"]])
    options = {**_CALIBRATOR_OPTIONS[cfg["method"]],
               **({"percentile": cfg["percentile"]} if cfg["method"] == "percentile" else {})}
    ranges = ctx.output("calibration.json")
    try:
        with _quiet(ctx.log):
            calibrator = create_calibrator(fp32, sorted(set(QLinearOpsRegistry) | set(QDQRegistry)),
                                           augmented_model_path=str(ctx.scratch / "augmented.onnx"),
                                           calibrate_method=method, extra_options=options)
            calibrator.collect_data(Reader())
            save_tensors_data(calibrator.compute_data(), ranges)
            del calibrator
            quantize_static(str(fp32), str(out_path), None, quant_format=QuantFormat.QDQ,
                            per_channel=cfg["per_channel"], activation_type=QuantType.QInt8,
                            weight_type=QuantType.QInt8, nodes_to_exclude=cfg["exclude_nodes"],
                            calibrate_method=method, calibration_cache_path=str(ranges))
    except Exception as exc:  # onnxruntime raises whatever its passes raise
        lines = str(exc).strip().splitlines() or [type(exc).__name__]
        raise ctx.error(f"onnxruntime cannot quantize the model: {type(exc).__name__}: {lines[-1]}",
                        hint="exclude the node it names (exclude_nodes), or ship this model in "
                             "fp32/fp16 only")
    finally:
        for scratch in ("fp32.onnx", "augmented.onnx"):
            (ctx.scratch / scratch).unlink(missing_ok=True)
    ranges.write_text(json.dumps(json.loads(ranges.read_text()), indent=1, sort_keys=True) + "\n")
    return {"calibration": {"samples": len(samples), "method": cfg["method"],
                            "percentile": cfg["percentile"], "per_channel": cfg["per_channel"],
                            "calibrator_options": _CALIBRATOR_OPTIONS[cfg["method"]]},
            "constants_as_initializers": moved}


def _fp16(ctx, model, out_path) -> dict:
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16
    cfg = ctx.config
    before = {n.name for n in model.graph.node}
    from onnxruntime.transformers.onnx_model import OnnxModel
    with _quiet(ctx.log):
        half = convert_float_to_float16(model, keep_io_types=cfg["io_dtype"] == "float32",
                                        node_block_list=cfg["exclude_nodes"])
        OnnxModel(half).topological_sort()  # the converter appends its input Casts at the end
    onnx.save(half, str(out_path))
    casts = [{"node": n.name, "from": n.input[0], "to": n.output[0],
              "dtype": {1: "float32", 10: "float16"}.get(n.attribute[0].i, str(n.attribute[0].i))}
             for n in half.graph.node if n.op_type == "Cast" and n.name not in before]
    return {"io_dtype": cfg["io_dtype"], "casts": casts}


def run(ctx) -> None:
    import onnx
    cfg = ctx.config
    model = onnx.load(str(ctx.input("model")))
    _check_nodes(ctx, model, cfg["exclude_nodes"])
    out_path = ctx.scratch / "reduced.onnx"
    detail = (_int8 if cfg["precision"] == "int8" else _fp16)(ctx, model, out_path)
    reduced = onnx.load(str(out_path))
    out_path.unlink()
    contrib = sorted({f"{n.domain}::{n.op_type}" for n in reduced.graph.node
                      if n.domain not in ("", "ai.onnx")})
    if contrib:
        raise ctx.error(f"the {cfg['precision']} model uses non-standard ops {', '.join(contrib)}, "
                        f"which IREE and TVM cannot compile", hint="report this: QDQ output "
                        "should hold standard ONNX ops only")
    ops = collections.Counter(n.op_type for n in reduced.graph.node)
    if cfg["precision"] == "int8":
        quantized = _quantized_nodes(reduced)
        if not quantized:
            raise ctx.error("nothing was quantized: onnxruntime found no op it quantizes (Conv, "
                            "MatMul, Gemm, ...) outside exclude_nodes",
                            hint="an int8 variant of this model would be the fp32 model: drop it")
        detail["quantized_nodes"] = len(quantized)
        detail["float_nodes"] = sorted(
            n.name for n in reduced.graph.node
            if n.op_type not in ("QuantizeLinear", "DequantizeLinear", "Constant")
            and n.name not in quantized)
    else:
        detail["fp16_initializers"] = sum(1 for t in reduced.graph.initializer
                                          if t.data_type == onnx.TensorProto.FLOAT16)
    reduced.graph.name = model.graph.name
    onnx.checker.check_model(reduced)
    ctx.output("model.onnx").write_bytes(reduced.SerializeToString(deterministic=True))
    summary = {"precision": cfg["precision"], "exclude_nodes": cfg["exclude_nodes"], **detail}
    if cfg["precision"] == "int8":
        summary.update(format="QDQ", activations="int8", weights="int8")
        summary["calibration"] = {**summary["calibration"], **_dataset(ctx, "calibration")}
    report = {"summary": summary, "ops": dict(sorted(ops.items())),
              "opset": max(o.version for o in reduced.opset_import if o.domain in ("", "ai.onnx")),
              "nodes": len(reduced.graph.node)}
    ctx.output("quantize.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")


def _dataset(ctx, key: str) -> dict:
    """A data set as reports name it: its files with their sha256, and one sha256 over them all."""
    from ..core.store import canonical_json, sha256_file, sha256_text
    files = [[n, sha256_file(ctx.input(f"{key}:{n}"))] for n in ctx.config[key]["files"]]
    return {"kind": ctx.config[key]["kind"], "files": len(files),
            "sha256": sha256_text(canonical_json(files))}


def _quantized_nodes(model) -> set[str]:
    """Nodes (other than Q/DQ) that read a DequantizeLinear output: they compute on int8 data."""
    dq = {o for n in model.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    return {n.name for n in model.graph.node
            if n.op_type not in ("QuantizeLinear", "DequantizeLinear") and dq & set(n.input)}


# ----------------------------------------------------------------------------- steps
def steps(project) -> list:
    """One step per precision variant (int8: calibrated QDQ; fp16: converted)."""
    return [quantize_step(project.layout, m, v) for m in project.models for v in m.variants]


def quantize_step(layout, model, v) -> Step:
    name = full_name(model, v)
    data = {f"calibration:{p.name}": p for p in (v.calibration.files if v.calibration else ())}
    return Step(
        stage="quantize", name=name, version=VERSION,
        config={**v.quantize_config(), "inputs": variant_inputs(model),
                "preprocessing": variant_preprocessing(model),
                "calibration": v.calibration.as_dict() if v.calibration else None},
        inputs={"model": static_model(layout, model), **data}, outputs=OUTPUTS[v.precision],
        out_dir=layout.model_stage(name, "quantize"), tools=variant_tools(v), action=run,
        layout=layout, where={"model": name},
        doc=(f"int8 QDQ static quantization ({v.method}, "
             f"{'per-channel' if v.per_channel else 'per-tensor'}) on "
             f"{len(v.calibration.files)} calibration samples" if v.precision == "int8"
             else "fp16 conversion (Casts recorded)"))
