"""Precision variants: a model's fp16 / int8 forms, each its own chain of steps and keys.

A variant is declared under `variants:` in model.yaml and named `<model>.<variant>` everywhere
(tasks, artifacts/, the manifest; not `@`: iree-run-module reads `--module=a@b` as something
else and crashes). Its chain, next to the model's fp32 one:

    static (fp32) ─> quantize ─> accuracy (the gate) ─> golden ─> iree_compile ─> validate ─> manifest
                                      └─ evaluation data        (per target ABI, as for fp32)

  quantize      int8: onnxruntime static quantization, QDQ format, on the calibration data;
                fp16: explicit conversion, the inserted Casts recorded (pipeline/stages/quantize.py)
  accuracy      the variant against fp32 on the evaluation data (distinct from calibration),
                thresholds from the spec; layer-by-layer divergence (pipeline/stages/accuracy.py).
                A failing gate fails the build: nothing after it runs for that variant
  golden        onnxruntime outputs of the variant (its own reference) and of fp32 on the
                evaluation sample where they differ most, by the gate's worst cosine
                (pipeline/stages/golden.py: run_variant)
  iree_compile  the variant's ONNX with the ABI's flags; validate: against the variant's
                golden (the variant's `tolerance`) and against fp32 (the gate's max_abs and
                cosine; one sample's mean_abs is held to max_abs, see Gate.sample_tolerance)

Variants inherit the model's `skip:`, and may add their own (`skip:` in the variant). An fp16 variant is also left out of every Vulkan ABI whose
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

import dataclasses
import fnmatch
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal, Optional

from pydantic import Field

from ..core.store import sha256_file
from .calibration import Dataset, check_dataset_fits, list_dataset, parse_preprocessing
from .common import CLOSED, NAME_RE, Doc, Fraction, NonNegative, Says, ToleranceDoc, given, inside

PRECISIONS = ("fp16", "int8")
METHODS = ("minmax", "entropy", "percentile")
IO_DTYPES = ("float32", "float16")
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
    skip: tuple = ()             # ((ABI name pattern, reason), ...): besides the model's own skip

    def skip_reason(self, abi: str) -> str | None:
        return next((reason for pattern, reason in self.skip if fnmatch.fnmatchcase(abi, pattern)),
                    None)

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


def variant_model(model, variant: VariantSpec):
    """The ModelSpec the fp32 step builders see for a variant's chain (its name, its tolerance)."""
    return dataclasses.replace(model, name=full_name(model, variant), tolerance=variant.tolerance,
                               variants=())


# What a variant's steps (quantize, accuracy, golden, rknn_compile) put in their configs.
def variant_inputs(model) -> list[dict]:
    return [{"name": i.name, "shape": list(i.shape), "dtype": i.dtype} for i in model.inputs]


def variant_preprocessing(model) -> dict:
    return {k: p.as_dict() for k, p in sorted(model.preprocessing.items())}


def variant_tools(v: VariantSpec) -> tuple:
    return ("onnx", "onnxruntime", "numpy") + (
        ("pillow",) if "image" in (v.evaluation.kind, getattr(v.calibration, "kind", None)) else ())


# ----------------------------------------------------------------------------- spec
class CalibrationDoc(Doc):
    """int8 only: the data the quantizer measures activation ranges on."""
    data: str
    """a folder of samples, relative to the model folder and inside it (see docs/variants.md)"""
    method: Literal[METHODS] = "minmax"
    percentile: Annotated[float, Field(ge=50, le=100)] = None
    """method percentile only (default 99.999)"""
    per_channel: bool = False


class GateDoc(Doc):
    """The variant against fp32 over the evaluation set: fails the build if not met."""
    max_abs: NonNegative
    """max |variant - fp32| over all samples and elements"""
    mean_abs: NonNegative
    """mean |variant - fp32|"""
    cosine: Fraction
    """the worst sample's cosine similarity"""
    top1_agreement: Fraction = None
    """classifiers: the share of samples whose argmax over the last axis agrees"""


class DivergenceDoc(Doc):
    """The layer-by-layer table of the accuracy report."""
    samples: Annotated[int, Field(ge=1)] = 4
    """the N worst evaluation samples"""
    cosine: NonNegative = 0.98
    """per-layer tolerance"""


class VariantDoc(Doc):
    """A precision variant: the model in fp16 or int8, its own chain of steps."""
    precision: Literal[PRECISIONS] = None
    """default: the variant's name, when it is fp16 or int8"""
    calibration: CalibrationDoc = None
    exclude_nodes: list[str] = []
    """node names left in fp32"""
    io_dtype: Literal[IO_DTYPES] = None
    """fp16 only: float32 (default: Casts at the boundary) or float16"""
    evaluation: str
    """a folder of samples (in the model folder) the gate compares fp32 and the variant on, none
    used for calibration"""
    gate: GateDoc
    tolerance: Optional[ToleranceDoc] = None
    """artifacts vs the variant's own golden (default: the model's tolerance)"""
    divergence: Optional[DivergenceDoc] = None
    skip: Optional[dict[str, Annotated[str, Field(pattern=r"\S")]]] = None
    """ABI name patterns this variant is not built for, each with its reason (besides the
    model's own skip, which variants inherit)"""


Variants = Annotated[dict[Annotated[str, Field(pattern=f"^(?!fp32$){NAME_RE.pattern[1:]}"), Says(
    f"a variant name must match {NAME_RE.pattern} and is not fp32 (the model itself)")],
                          VariantDoc], Field(min_length=1, json_schema_extra=CLOSED)]


def parse(pre_doc, doc, spec_dir: Path, inputs: dict, tolerance, where: str, problems: list):
    """`preprocessing:` and `variants:` of a model spec -> (preprocessing, variants); inputs:
    name -> (shape, dtype) of the model spec's inputs (None where invalid)."""
    preprocessing = parse_preprocessing(pre_doc, inputs, where, problems)
    out = []
    for name, v in (doc or {}).items():
        vw = f"{where}: variants.{name}"
        if v is None:
            continue
        precision = v.precision or (name if name in PRECISIONS else None)
        if precision is None:
            if not given(v, "precision"):
                problems.append(f"{vw}.precision: expected one of {', '.join(PRECISIONS)}, got None")
            continue
        kw = {}
        calib = v.calibration
        if precision == "int8" and calib is not None:
            if calib.data is not None:
                dw = f"{vw}.calibration.data"
                kw["calibration"] = list_dataset(inside(spec_dir, calib.data, dw, problems), dw,
                                                 problems, spec_dir)
            kw["method"], kw["per_channel"] = calib.method, calib.per_channel
            if given(calib, "percentile") and calib.method != "percentile":
                problems.append(f"{vw}.calibration.percentile: only for method: percentile")
            if calib.method == "percentile":
                kw["percentile"] = 99.999 if calib.percentile is None else calib.percentile
        elif precision == "int8" and not given(v, "calibration"):
            problems.append(f"{vw}.calibration: an int8 variant needs calibration: "
                            f"{{data: FOLDER, method: minmax|entropy|percentile, per_channel}}")
        elif precision != "int8" and given(v, "calibration"):
            problems.append(f"{vw}.calibration: only int8 variants are calibrated")
        if precision != "fp16" and given(v, "io_dtype"):
            problems.append(f"{vw}.io_dtype: only for fp16 variants (int8 QDQ keeps float32 I/O)")
        kw["io_dtype"] = v.io_dtype or "float32"
        kw["exclude_nodes"] = tuple(v.exclude_nodes or ())
        if v.evaluation is not None:
            ew = f"{vw}.evaluation"
            kw["evaluation"] = list_dataset(inside(spec_dir, v.evaluation, ew, problems), ew,
                                            problems, spec_dir)
        kw["gate"] = v.gate and Gate(v.gate.max_abs, v.gate.mean_abs, v.gate.cosine,
                                     v.gate.top1_agreement)
        kw["tolerance"] = v.tolerance.spec() if v.tolerance else tolerance
        kw["skip"] = tuple(sorted((k, " ".join(r.split())) for k, r in (v.skip or {}).items()))
        div = v.divergence or DivergenceDoc()
        kw["divergence_samples"], kw["divergence_cosine"] = div.samples, div.cosine
        for key in ("calibration", "evaluation"):
            if kw.get(key) is not None and None not in inputs.values():
                check_dataset_fits(kw[key], inputs, preprocessing, f"{vw}.{key}", problems)
        if kw.get("calibration") and kw.get("evaluation"):
            seen = {sha256_file(p): p.name for p in kw["calibration"].files}
            shared = [p.name for p in kw["evaluation"].files if sha256_file(p) in seen]
            if shared:
                problems.append(f"{vw}.evaluation: {len(shared)} sample(s) also in the calibration "
                                f"set ({', '.join(shared[:5])}): the gate must measure data the "
                                f"quantizer never saw")
        if not problems:  # the specs are made only from a document without any problem
            out.append(VariantSpec(name=name, precision=precision, **kw))
    return preprocessing, tuple(out)
