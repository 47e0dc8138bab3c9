"""Test inputs from a model's recipe, and the comparison of outputs with golden outputs.

Metrics per output, computed in float64 over the flattened tensors:
  max_abs   max |actual - expected|
  mean_abs  mean |actual - expected|
  cosine    cosine similarity (1.0 when both are all zeros)
An output passes when max_abs <= tol.max_abs, mean_abs <= tol.mean_abs, cosine >= tol.cosine,
and its shape and dtype equal the golden ones. Non-finite values never pass.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # numpy is imported where arrays are made or compared: not when the project loads
    import numpy as np


def make_input(spec: dict, file: Path | None = None) -> np.ndarray:
    """One test input from its recipe ({"random": {seed, low, high}} or {"file": ...})."""
    import numpy as np
    shape, dtype = tuple(spec["shape"]), np.dtype(spec["dtype"])
    data = spec["test_data"]
    if "file" in data:
        array = np.load(file, allow_pickle=False)
        if array.shape != shape or array.dtype != dtype:
            raise ValueError(f"{file.name} holds {array.dtype}{list(array.shape)}, "
                             f"the spec says {dtype}{list(shape)}")
        return array
    rnd = data["random"]
    rng = np.random.default_rng(rnd["seed"])
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if np.issubdtype(dtype, np.integer):
        return rng.integers(int(np.ceil(rnd["low"])), int(np.floor(rnd["high"])) + 1, size=shape,
                            dtype=dtype)
    return rng.uniform(rnd["low"], rnd["high"], size=shape).astype(dtype)


def _finite_or_none(x: float) -> float | None:
    import numpy as np
    return float(x) if np.isfinite(x) else None


def compare_one(name: str, actual: np.ndarray, expected: np.ndarray, tol: dict) -> dict:
    import numpy as np
    row = {"name": name, "shape": list(expected.shape), "dtype": str(expected.dtype),
           "max_abs": None, "mean_abs": None, "cosine": None, "failures": []}
    if actual.shape != expected.shape:
        row["failures"].append(f"shape {list(actual.shape)} != golden {list(expected.shape)}")
        return row
    if actual.dtype != expected.dtype:
        row["failures"].append(f"dtype {actual.dtype} != golden {expected.dtype}")
    a = actual.astype(np.float64).ravel()
    e = expected.astype(np.float64).ravel()
    if not np.all(np.isfinite(a)) and np.all(np.isfinite(e)):
        row["failures"].append(f"{int(np.sum(~np.isfinite(a)))} non-finite values (golden has none)")
    diff = np.abs(a - e)
    row["max_abs"] = _finite_or_none(diff.max()) if diff.size else 0.0
    row["mean_abs"] = _finite_or_none(diff.mean()) if diff.size else 0.0
    na, ne = np.linalg.norm(a), np.linalg.norm(e)
    if na == 0 and ne == 0:
        row["cosine"] = 1.0
    elif na == 0 or ne == 0:
        row["cosine"] = 0.0
    else:
        row["cosine"] = _finite_or_none(np.dot(a, e) / (na * ne))
    for metric, limit, worse in (("max_abs", tol["max_abs"], "above"),
                                 ("mean_abs", tol["mean_abs"], "above"),
                                 ("cosine", tol["cosine"], "below")):
        value = row[metric]
        if value is None:
            row["failures"].append(f"{metric} is not finite")
        elif (value > limit) if worse == "above" else (value < limit):
            row["failures"].append(f"{metric} {value:.3g} is {worse} the tolerance {limit:.3g}")
    return row


def compare(actual: list[np.ndarray], expected: list[np.ndarray], names: list[str],
            tol: dict) -> dict:
    if len(actual) != len(expected):
        return {"passed": False, "outputs": [],
                "failures": [f"{len(actual)} outputs, golden has {len(expected)}"]}
    rows = [compare_one(n, a, e, tol) for n, a, e in zip(names, actual, expected)]
    return {"passed": all(not r["failures"] for r in rows), "outputs": rows}


def describe_failures(result: dict) -> str:
    lines = list(result.get("failures", []))
    for row in result["outputs"]:
        for failure in row["failures"]:
            lines.append(f"output {row['name']!r}: {failure}")
    return "; ".join(lines)


def summary(result: dict) -> str:
    """One line of figures, e.g. for progress output and error messages."""
    parts = []
    for row in result["outputs"]:
        fmt = lambda v: "n/a" if v is None else f"{v:.3g}"
        parts.append(f"{row['name']}: max_abs={fmt(row['max_abs'])} mean_abs={fmt(row['mean_abs'])} "
                     f"cosine={fmt(row['cosine'])}")
    return "; ".join(parts)
