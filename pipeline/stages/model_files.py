"""Where a model's own steps (import, golden, static, quantize, accuracy) find their files, and what
their configs share. Kept apart from plan.py (which asks the backends which ABIs a model is built
for) so that the code digest of these stages does not take in the compilers and their runners: an
edit to a runner re-runs the steps that run artifacts, not a model's golden or static step."""
from __future__ import annotations

from pathlib import Path

ENTRY = "main"  # the compiled entry point of every artifact


def static_model(layout, model) -> Path:
    return layout.model_stage(model.name, "static") / "model.onnx"


def outputs_for(n_inputs: int, n_outputs: int) -> tuple[str, ...]:
    """The golden step's files: golden.json, input_<i>.npy, output_<k>.npy."""
    return (("golden.json",) + tuple(f"input_{i}.npy" for i in range(n_inputs))
            + tuple(f"output_{k}.npy" for k in range(n_outputs)))


def golden_files(layout, model) -> dict:
    folder = layout.model_stage(model.name, "golden")
    n_out = len(model.signature["outputs"])
    files = {"golden.json": folder / "golden.json"}
    for name in outputs_for(len(model.inputs), n_out)[1:]:
        files[f"golden:{name}"] = folder / name
    return files


def variant_inputs(model) -> list[dict]:
    return [{"name": i.name, "shape": list(i.shape), "dtype": i.dtype} for i in model.inputs]


def variant_preprocessing(model) -> dict:
    return {k: p.as_dict() for k, p in sorted(model.preprocessing.items())}


def variant_tools(v) -> tuple:
    return ("onnx", "onnxruntime", "numpy") + (
        ("pillow",) if "image" in (v.evaluation.kind, getattr(v.calibration, "kind", None)) else ())
