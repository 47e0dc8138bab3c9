"""Specs: models/*/model.yaml and the target registry -> frozen, validated specs.

One module per section: `model` (source, inputs, tolerance, release, skip), `target` (ABIs,
fallback), `variants` (precision variants), `calibration` (datasets, preprocessing), `tvm`
(TVM ABIs, tuning budgets), `ship` (compiler choice slots), `shapes` (shape variants),
`sources` (source formats and their I/O signatures); `common` holds what they share. Each
declares its part of the YAML as a typed document (pydantic) beside the code that checks the
rest and makes the frozen spec; `schema` exports those documents as docs/schema/*.json.
Loading reads files only: no compiler or runtime is imported or run.
"""
from .common import NAME_RE, Tolerance, display
from .model import InputSpec, ModelSpec, TestData, load_model, load_models, model_signature
from .target import TARGETS_DIR, AbiSpec, TargetSpec, known_targets, load_target

__all__ = ["NAME_RE", "Tolerance", "display", "InputSpec", "ModelSpec", "TestData", "load_model",
           "load_models", "model_signature", "TARGETS_DIR", "AbiSpec", "TargetSpec",
           "known_targets", "load_target"]
