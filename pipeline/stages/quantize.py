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
from dataclasses import dataclass

from ..core.layout import static_model
from ..core.steps import StageConfig, Step, key_value
from ..core.store import pretty_json
from ..spec.samples import Samples, dataset_summary, load_data, sample_inputs_problems
from ..spec.variants import (IO_DTYPES, METHODS, PRECISIONS, full_name, variant_inputs,
                             variant_preprocessing, variant_tools)

VERSION = 1
OUTPUTS = {"int8": ("model.onnx", "quantize.json", "calibration.json"),
           "fp16": ("model.onnx", "quantize.json")}
_METHODS = {"minmax": "MinMax", "entropy": "Entropy", "percentile": "Percentile"}
# Histogram sizes: Entropy searches thresholds over 2048 bins for 128 quantized levels (as
# TensorRT does); Percentile takes onnxruntime's 2048 bins.
_CALIBRATOR_OPTIONS = {"minmax": {}, "entropy": {"num_bins": 2048, "num_quantized_bins": 128},
                       "percentile": {"num_bins": 2048}}
INT8_SCHEME = {"format": "QDQ", "activations": "int8", "weights": "int8"}  # what int8 means here


@dataclass(frozen=True)
class Config(StageConfig):
    precision: str                       # int8 | fp16
    exclude_nodes: tuple[str, ...]       # nodes left in fp32
    inputs: tuple[dict, ...]             # per model input: name, shape, dtype
    preprocessing: dict                  # input name -> spec.calibration.Preprocessing as a dict
    calibration: Samples | None          # int8: the samples ranges are measured on
    method: str | None = None            # int8: minmax | entropy | percentile
    percentile: float | None = None      # int8, method percentile: the percentile kept
    per_channel: bool | None = None      # int8: per-channel weights (else per-tensor)
    io_dtype: str | None = None          # fp16: the inputs/outputs' dtype, float32 | float16

    def problems(self):
        yield from sample_inputs_problems(self.inputs, self.preprocessing)
        if self.precision not in PRECISIONS:
            yield f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}"
        elif self.precision == "int8":
            if self.calibration is None:
                yield "an int8 variant needs calibration samples"
            if self.method not in METHODS:
                yield f"method must be one of {', '.join(METHODS)}, got {self.method!r}"
            if (self.percentile is not None) != (self.method == "percentile"):
                yield "percentile is given for method percentile, and only for it"
            if not isinstance(self.per_channel, bool):
                yield f"per_channel must be true or false, got {self.per_channel!r}"
            if self.io_dtype is not None:
                yield "io_dtype is for fp16 variants only"
        else:
            if self.io_dtype not in IO_DTYPES:
                yield f"io_dtype must be one of {', '.join(IO_DTYPES)}, got {self.io_dtype!r}"
            if (self.calibration, self.method, self.percentile, self.per_channel) != (None,) * 4:
                yield "an fp16 variant is converted, not calibrated: no calibration, method, " \
                      "percentile or per_channel"

    def as_key(self) -> dict:
        if self.precision == "fp16":
            key = {"precision": "fp16", "exclude_nodes": list(self.exclude_nodes),
                   "io_dtype": self.io_dtype}
        else:
            key = {"precision": "int8", **INT8_SCHEME, "method": self.method,
                   "percentile": self.percentile, "per_channel": self.per_channel,
                   "exclude_nodes": list(self.exclude_nodes)}
        return {**key, "inputs": key_value(self.inputs), "preprocessing": key_value(self.preprocessing),
                "calibration": key_value(self.calibration)}

    @classmethod
    def from_key(cls, key: dict) -> "Config":
        scheme = {k: key[k] for k in INT8_SCHEME if k in key}
        if scheme and scheme != INT8_SCHEME:
            raise ValueError(f"{__name__}.Config: int8 is {INT8_SCHEME} here, got {scheme}")
        rest = {k: v for k, v in key.items() if k not in INT8_SCHEME}
        calibration = rest["calibration"] and Samples.from_key(rest["calibration"])
        return cls(**{**rest, "calibration": calibration})

    @classmethod
    def of(cls, model, v) -> "Config":
        """The config of variant `v` of `model` (spec.variants.VariantSpec)."""
        common = dict(precision=v.precision, exclude_nodes=tuple(v.exclude_nodes),
                      inputs=variant_inputs(model), preprocessing=variant_preprocessing(model))
        if v.precision == "fp16":
            return cls(**common, calibration=None, io_dtype=v.io_dtype)
        return cls(**common, calibration=Samples.from_key(v.calibration.as_dict()),
                   method=v.method, percentile=v.percentile, per_channel=v.per_channel)


@contextlib.contextmanager
def _quiet(log):
    """onnxruntime's quantizer prints and logs warnings (pre-processing advice, histogram
    progress): into the step's log, not the build's output."""
    import onnxruntime as ort  # onnxruntime: 0.2 s, not needed by doit list
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
    import onnx  # onnx: 1.5 s, not needed by doit list
    # onnxruntime's quantizer: 1.7 s, not needed by doit list
    from onnxruntime.quantization import (CalibrationDataReader, CalibrationMethod, QuantFormat,
                                          QuantType, create_calibrator, quantize_static,
                                          save_tensors_data)
    # onnxruntime's quantizer: 1.7 s, not needed by doit list
    from onnxruntime.quantization.registry import QDQRegistry, QLinearOpsRegistry
    cfg = ctx.cfg
    samples = load_data(ctx, "calibration", cfg.calibration)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(samples)

        def get_next(self):
            return next(self.it, None)

    moved = constants_to_initializers(model)
    fp32 = ctx.scratch / "fp32.onnx"
    onnx.save(model, str(fp32))
    method = getattr(CalibrationMethod, _METHODS[cfg.method])
    options = {**_CALIBRATOR_OPTIONS[cfg.method],
               **({"percentile": cfg.percentile} if cfg.method == "percentile" else {})}
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
                            per_channel=cfg.per_channel, activation_type=QuantType.QInt8,
                            weight_type=QuantType.QInt8, nodes_to_exclude=list(cfg.exclude_nodes),
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
    return {"calibration": {"samples": len(samples), "method": cfg.method,
                            "percentile": cfg.percentile, "per_channel": cfg.per_channel,
                            "calibrator_options": _CALIBRATOR_OPTIONS[cfg.method]},
            "constants_as_initializers": moved}


def _fp16(ctx, model, out_path) -> dict:
    import onnx  # onnx: 1.5 s, not needed by doit list
    # onnxruntime's fp16 converter: 1.7 s, not needed by doit list
    from onnxruntime.transformers.float16 import convert_float_to_float16
    cfg = ctx.cfg
    before = {n.name for n in model.graph.node}
    # onnxruntime's fp16 converter: 1.7 s, not needed by doit list
    from onnxruntime.transformers.onnx_model import OnnxModel
    with _quiet(ctx.log):
        half = convert_float_to_float16(model, keep_io_types=cfg.io_dtype == "float32",
                                        node_block_list=list(cfg.exclude_nodes))
        OnnxModel(half).topological_sort()  # the converter appends its input Casts at the end
    onnx.save(half, str(out_path))
    casts = [{"node": n.name, "from": n.input[0], "to": n.output[0],
              "dtype": {1: "float32", 10: "float16"}.get(n.attribute[0].i, str(n.attribute[0].i))}
             for n in half.graph.node if n.op_type == "Cast" and n.name not in before]
    return {"io_dtype": cfg.io_dtype, "casts": casts}


def run(ctx) -> None:
    import onnx  # onnx: 1.5 s, not needed by doit list
    cfg = ctx.cfg
    model = onnx.load(str(ctx.input("model")))
    _check_nodes(ctx, model, cfg.exclude_nodes)
    out_path = ctx.scratch / "reduced.onnx"
    detail = (_int8 if cfg.precision == "int8" else _fp16)(ctx, model, out_path)
    reduced = onnx.load(str(out_path))
    out_path.unlink()
    contrib = sorted({f"{n.domain}::{n.op_type}" for n in reduced.graph.node
                      if n.domain not in ("", "ai.onnx")})
    if contrib:
        raise ctx.error(f"the {cfg.precision} model uses non-standard ops {', '.join(contrib)}, "
                        f"which IREE and TVM cannot compile", hint="report this: QDQ output "
                        "should hold standard ONNX ops only")
    ops = collections.Counter(n.op_type for n in reduced.graph.node)
    if cfg.precision == "int8":
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
    summary = {"precision": cfg.precision, "exclude_nodes": list(cfg.exclude_nodes), **detail}
    if cfg.precision == "int8":
        summary.update(INT8_SCHEME)
        summary["calibration"] = {**summary["calibration"], **dataset_summary(ctx, "calibration", cfg.calibration)}
    report = {"summary": summary, "ops": dict(sorted(ops.items())),
              "opset": max(o.version for o in reduced.opset_import if o.domain in ("", "ai.onnx")),
              "nodes": len(reduced.graph.node)}
    ctx.output("quantize.json").write_text(pretty_json(report))


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
        config=Config.of(model, v),
        inputs={"model": static_model(layout, model), **data}, outputs=OUTPUTS[v.precision],
        out_dir=layout.model_stage(name, "quantize"), tools=variant_tools(v), action=run,
        layout=layout, where={"model": name},
        doc=(f"int8 QDQ static quantization ({v.method}, "
             f"{'per-channel' if v.per_channel else 'per-tensor'}) on "
             f"{len(v.calibration.files)} calibration samples" if v.precision == "int8"
             else "fp16 conversion (Casts recorded)"))
