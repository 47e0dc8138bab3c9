"""Precision variants: a model's fp16 / int8 forms, each its own chain of steps and keys.

A variant is declared under `variants:` in model.yaml and named `<model>.<variant>` everywhere
(tasks, artifacts/, the manifest; not `@`: iree-run-module reads `--module=a@b` as something
else and crashes). Its chain, next to the model's fp32 one:

    static (fp32) ─> quantize ─> accuracy (the gate) ─> golden ─> iree_compile ─> validate ─> manifest
                                      └─ evaluation data        (per target ABI, as for fp32)

  quantize      int8: onnxruntime static quantization, QDQ format, on the calibration data;
                fp16: explicit conversion, the inserted Casts recorded (pipeline/quantize.py)
  accuracy      the variant against fp32 on the evaluation data (distinct from calibration),
                thresholds from the spec; layer-by-layer divergence (pipeline/accuracy.py).
                A failing gate fails the build: nothing after it runs for that variant
  golden        onnxruntime outputs of the variant (its own reference) and of fp32 on the
                evaluation sample where they differ most, by the gate's worst cosine
                (pipeline/golden.py: run_variant)
  iree_compile  the variant's ONNX with the ABI's flags; validate: against the variant's
                golden (the variant's `tolerance`) and against fp32 (the gate's max_abs and
                cosine; one sample's mean_abs is held to max_abs, see Gate.sample_tolerance)

Variants inherit the model's `skip:`. An fp16 variant is also left out of every Vulkan ABI whose
IREE target declares no 16-bit storage or fp16 arithmetic (e.g. vp_android_baseline_2022: fp16
kernels run there and return wrong numbers, no error); the reason is recorded like a skip, and
iree_compile refuses such a build in any case.

model.yaml:
    variants:
      int8:                            # name: [a-z0-9][a-z0-9_-]*; precision defaults to it
        precision: int8                # int8 | fp16
        calibration:                   # int8 only
          data: data/calibration       # a folder of samples (see calibration.py)
          method: minmax               # minmax | entropy | percentile
          percentile: 99.999           # percentile only (default 99.999)
          per_channel: false
        exclude_nodes: [Softmax_0]     # left in fp32 (int8: not quantized; fp16: kept fp32)
        io_dtype: float32              # fp16 only: float32 (default: Casts at the boundary) | float16
        evaluation: data/evaluation    # a folder of samples, none shared with calibration
        gate:                          # the variant vs fp32 over the evaluation set
          max_abs: 0.05                # max |variant - fp32| over all samples and elements
          mean_abs: 0.005              # mean |variant - fp32|
          cosine: 0.999                # the worst sample's cosine similarity
          top1_agreement: 0.98         # optional (classifiers): argmax over the last axis agrees
        tolerance: {max_abs: 1.0e-5, mean_abs: 1.0e-6, cosine: 0.999999}
                                       # artifacts vs the variant's own golden (default: the model's)
        divergence: {samples: 4, cosine: 0.98}   # layer table: the N worst samples, per-layer tolerance
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .calibration import Dataset, check_dataset_fits, list_dataset, parse_preprocessing
from ..core.errors import unknown_keys
from .common import NAME_RE, Tolerance, number

PRECISIONS = ("fp16", "int8")
METHODS = ("minmax", "entropy", "percentile")
IO_DTYPES = ("float32", "float16")
_VARIANT_KEYS = {"precision", "calibration", "exclude_nodes", "io_dtype", "evaluation", "gate",
                 "tolerance", "divergence"}
_CALIBRATION_KEYS = {"data", "method", "percentile", "per_channel"}
_GATE_KEYS = {"max_abs", "mean_abs", "cosine", "top1_agreement"}
_DIVERGENCE_KEYS = {"samples", "cosine"}
FP16_FEATURES = ("shaderFloat16", "storageBuffer16BitAccess")


@dataclass(frozen=True)
class Gate:
    max_abs: float
    mean_abs: float
    cosine: float
    top1_agreement: float | None = None

    def as_dict(self) -> dict:
        d = {"max_abs": self.max_abs, "mean_abs": self.mean_abs, "cosine": self.cosine}
        if self.top1_agreement is not None:
            d["top1_agreement"] = self.top1_agreement
        return d

    def sample_tolerance(self) -> dict:
        """What the gate promises for any one evaluation-like sample, as numerics.compare takes
        it: max_abs and the worst-sample cosine bound every sample; mean_abs is an average over
        the set, so one sample is held to max_abs there (its mean is at most its max)."""
        return {"max_abs": self.max_abs, "mean_abs": self.max_abs, "cosine": self.cosine}


@dataclass(frozen=True)
class VariantSpec:
    name: str
    precision: str
    evaluation: Dataset
    gate: Gate
    tolerance: object            # spec.Tolerance: artifacts vs this variant's own golden
    calibration: Dataset | None = None
    method: str = "minmax"
    percentile: float | None = None
    per_channel: bool = False
    exclude_nodes: tuple[str, ...] = ()
    io_dtype: str = "float32"
    divergence_samples: int = 4
    divergence_cosine: float = 0.98

    def quantize_config(self) -> dict:
        if self.precision == "fp16":
            return {"precision": "fp16", "exclude_nodes": list(self.exclude_nodes),
                    "io_dtype": self.io_dtype}
        return {"precision": "int8", "format": "QDQ", "activations": "int8", "weights": "int8",
                "method": self.method, "percentile": self.percentile,
                "per_channel": self.per_channel, "exclude_nodes": list(self.exclude_nodes)}

    def data_files(self) -> list[Path]:
        return list(self.calibration.files if self.calibration else ()) + list(self.evaluation.files)


def full_name(model, variant: VariantSpec) -> str:
    return f"{model.name}.{variant.name}"


# ----------------------------------------------------------------------------- spec
def parse(raw: dict, spec_dir: Path, inputs: list, tolerance, where: str, problems: list):
    """`preprocessing:` and `variants:` of a model spec -> (preprocessing, variants)."""
    shapes = {i.name: (i.shape, i.dtype) for i in inputs}
    preprocessing = parse_preprocessing(raw.get("preprocessing"), shapes, where, problems)
    body = raw.get("variants")
    if body is None:
        return preprocessing, ()
    if not isinstance(body, dict) or not body:
        problems.append(f"{where}: variants: expected a mapping of variant name -> "
                        f"{{precision, calibration, evaluation, gate, ...}}")
        return preprocessing, ()
    out = []
    for name, v in body.items():
        vw = f"{where}: variants.{name}"
        if not isinstance(name, str) or not NAME_RE.match(name) or name == "fp32":
            problems.append(f"{vw}: a variant name must match {NAME_RE.pattern} and is not "
                            f"fp32 (the model itself)")
            continue
        if not isinstance(v, dict):
            problems.append(f"{vw}: expected a mapping with precision, evaluation, gate, ...")
            continue
        unknown_keys(problems, vw, v, _VARIANT_KEYS)
        before = len(problems)
        precision = v.get("precision", name if name in PRECISIONS else None)
        if precision not in PRECISIONS:
            problems.append(f"{vw}.precision: expected one of {', '.join(PRECISIONS)}, got "
                            f"{precision!r}")
            continue
        kw = {}
        calib = v.get("calibration")
        if precision == "int8":
            if not isinstance(calib, dict) or "data" not in calib:
                problems.append(f"{vw}.calibration: an int8 variant needs calibration: "
                                f"{{data: FOLDER, method: minmax|entropy|percentile, per_channel}}")
            else:
                unknown_keys(problems, f"{vw}.calibration", calib, _CALIBRATION_KEYS)
                kw["calibration"] = list_dataset(spec_dir / str(calib["data"]),
                                                 f"{vw}.calibration.data", problems)
                method = calib.get("method", "minmax")
                if method not in METHODS:
                    problems.append(f"{vw}.calibration.method: {method!r} is not one of "
                                    f"{', '.join(METHODS)}")
                kw["method"] = method
                if "percentile" in calib and method != "percentile":
                    problems.append(f"{vw}.calibration.percentile: only for method: percentile")
                if method == "percentile":
                    p = number(calib.get("percentile", 99.999), f"{vw}.calibration.percentile",
                                problems, minimum=50)
                    if p is not None and p > 100:
                        problems.append(f"{vw}.calibration.percentile: at most 100, got {p}")
                    kw["percentile"] = p
                per_channel = calib.get("per_channel", False)
                if not isinstance(per_channel, bool):
                    problems.append(f"{vw}.calibration.per_channel: expected true or false")
                kw["per_channel"] = per_channel
        elif calib is not None:
            problems.append(f"{vw}.calibration: only int8 variants are calibrated")
        io_dtype = v.get("io_dtype", "float32")
        if precision != "fp16" and "io_dtype" in v:
            problems.append(f"{vw}.io_dtype: only for fp16 variants (int8 QDQ keeps float32 I/O)")
        elif io_dtype not in IO_DTYPES:
            problems.append(f"{vw}.io_dtype: expected one of {', '.join(IO_DTYPES)}")
        kw["io_dtype"] = io_dtype
        exclude = v.get("exclude_nodes", [])
        if not isinstance(exclude, list) or not all(isinstance(n, str) for n in exclude):
            problems.append(f"{vw}.exclude_nodes: expected a list of node names")
            exclude = []
        kw["exclude_nodes"] = tuple(exclude)
        if "evaluation" not in v:
            problems.append(f"{vw}: missing required key 'evaluation' (a folder of samples the "
                            f"gate compares fp32 and {precision} on, none used for calibration)")
        else:
            kw["evaluation"] = list_dataset(spec_dir / str(v["evaluation"]), f"{vw}.evaluation",
                                            problems)
        kw["gate"] = _gate(v.get("gate"), vw, problems)
        tol = v.get("tolerance")
        kw["tolerance"] = tolerance
        if tol is not None:
            vals = {}
            if not isinstance(tol, dict) or set(tol) != {"max_abs", "mean_abs", "cosine"}:
                problems.append(f"{vw}.tolerance: expected max_abs, mean_abs and cosine")
            else:
                vals = {k: number(tol[k], f"{vw}.tolerance.{k}", problems, minimum=0) for k in tol}
            if vals and None not in vals.values():
                kw["tolerance"] = Tolerance(**vals)
        div = v.get("divergence") or {}
        if not isinstance(div, dict):
            problems.append(f"{vw}.divergence: expected a mapping with samples and cosine")
            div = {}
        for key in sorted(set(div) - _DIVERGENCE_KEYS):
            problems.append(f"{vw}.divergence: unknown key {key!r} (allowed: samples, cosine)")
        kw["divergence_samples"] = number(div.get("samples", 4), f"{vw}.divergence.samples",
                                           problems, kind=int, minimum=1)
        kw["divergence_cosine"] = number(div.get("cosine", 0.98), f"{vw}.divergence.cosine",
                                          problems, minimum=0)
        for key in ("calibration", "evaluation"):
            if key in kw and kw[key] is not None:
                check_dataset_fits(kw[key], shapes, preprocessing, f"{vw}.{key}", problems)
        if kw.get("calibration") and kw.get("evaluation"):
            from ..core.store import sha256_file
            seen = {sha256_file(p): p.name for p in kw["calibration"].files}
            shared = [p.name for p in kw["evaluation"].files if sha256_file(p) in seen]
            if shared:
                problems.append(f"{vw}.evaluation: {len(shared)} sample(s) also in the calibration "
                                f"set ({', '.join(shared[:5])}): the gate must measure data the "
                                f"quantizer never saw")
        if len(problems) == before:
            out.append(VariantSpec(name=name, precision=precision, **kw))
    return preprocessing, tuple(out)


def _gate(raw, vw: str, problems: list) -> Gate | None:
    if not isinstance(raw, dict):
        problems.append(f"{vw}.gate: required: {{max_abs, mean_abs, cosine, top1_agreement?}} "
                        f"(the variant against fp32 on the evaluation set)")
        return None
    unknown_keys(problems, f"{vw}.gate", raw, _GATE_KEYS)
    vals = {}
    for key in ("max_abs", "mean_abs", "cosine", "top1_agreement"):
        if key not in raw:
            if key != "top1_agreement":
                problems.append(f"{vw}.gate: missing required key {key!r}")
            continue
        vals[key] = number(raw[key], f"{vw}.gate.{key}", problems, minimum=0)
        if key in ("cosine", "top1_agreement") and vals[key] is not None and vals[key] > 1:
            problems.append(f"{vw}.gate.{key}: at most 1, got {vals[key]}")
    if None in vals.values() or not {"max_abs", "mean_abs", "cosine"} <= set(vals):
        return None
    return Gate(**vals)
