"""Test inputs from a model's recipe, and the comparison of outputs with golden outputs.

An output is judged by the rule its golden dtype calls for (`compared` in its row):

float    max_abs   max |actual - expected|, in float64 over the flattened tensors
         mean_abs  mean |actual - expected|
         cosine    cosine similarity: the direction of the output, whatever its scale
  It passes when max_abs <= tol.max_abs, mean_abs <= tol.mean_abs and cosine >= tol.cosine.
  Cosine is only meaningful when golden stands out of the absolute tolerance. When golden is
  zero at the tolerance's resolution (its largest magnitude within max_abs and its mean
  magnitude within mean_abs: an all-zero output would pass; e.g. a segmentation map that is ~0
  everywhere on random test inputs), its direction is rounding noise, and the cosine of two
  noise vectors (0 against an all-zero side) says nothing about the artifact. Such an output is
  judged on max_abs and mean_abs alone; an artifact far from zero still fails on them. Never
  silently: its row has `cosine: null` and `cosine_skipped` says why. An empty output passes
  the same way. So the looser the absolute bounds, the more outputs this takes in: a bound
  above everything an output holds (a gate's max_abs 0.1 on probabilities of 0.05) leaves only
  the absolute figures to judge it, and the row says so.
integer  class ids, token ids, quantized uint8/int8 tensors: element by element, exactly; a
  quantized output may be allowed `tol.integer_steps` quantization steps (default 0). The row
  gives `mismatches` (elements off by any step), `mismatch_fraction` and `max_steps`; max_abs and
  mean_abs are in steps. Exact for every integer dtype (int8 -128 vs 127 is 255 steps).
  A tolerance without integer_steps whose max_abs is 1 or more (`max_abs: 4` for a uint8
  output) means steps: an integer difference within max_abs is that many steps, so max_abs is
  read as integer_steps and the row says so (`integer_steps: 4, integer_steps_from: max_abs`).
  Such a max_abs must then be a whole number: 2.5 steps is no bound a user meant, and the spec
  is refused (integer_max_abs_problem; a tolerance that reaches compare anyway fails the row
  with the same words). A max_abs below 1 (the usual 1e-4 of a model with float and integer
  outputs) leaves integer outputs exact: no integer difference fits under it.
bool     masks: `mismatches` and `mismatch_fraction`, which must be at most
  `tol.bool_mismatch` (default 0: exact); max_abs is 1 if any element differs, mean_abs the
  fraction.
Integer and bool rows have `cosine: null` and `cosine_skipped` naming their rule.

Always failures: a shape or dtype other than golden's (with no figures when the dtype is of
another kind, e.g. float for an integer golden), a non-finite value on either side (golden
included: no tolerance judges a NaN). Every row keeps max_abs, mean_abs and cosine (what the
manifest, the bench report and config search read), `failures` (empty when it passed) and
`cosine_skipped` (null when cosine judged the output).

The tolerance is a dict as the spec's Tolerance.as_dict gives it: max_abs, mean_abs and cosine,
and the optional integer_steps and bool_mismatch (left out at their defaults: a spec that gives
neither records the tolerance it always did).

Reduced precision (`compare(..., precision="fp16" | "int8")`: an artifact that computes in fp16,
or an int8 build): its error follows the magnitude of what it computes, so an absolute bound
that fits probabilities cannot pass a correct build of an output in pixels (fp16 holds 0.25 at
320). A float output's bounds are then

    max_abs'  = max(max_abs,  K * eps * max |golden|)
    mean_abs' = max(mean_abs, K * eps * mean |golden|)

with eps the precision's machine epsilon (EPS: fp16 2**-10, the step between 1 and the next
fp16; int8 2**-7, one quantization step of a tensor quantized over [-max, max]) and K = 4
(SCALE_K: fp16 rounds each result to within eps/2 of its magnitude; a network adds a few such
roundings). The cosine bound is unchanged. Such a row carries `tolerance`: the bounds applied,
the precision, eps, K and golden's max and mean magnitude. fp32 (precision None) is compared
with the declared bounds exactly as they are, its rows without that key.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # numpy is imported where arrays are made or compared: not when the project loads
    import numpy as np


def make_input(spec: dict, file: Path | None = None) -> np.ndarray:
    """One test input from its recipe ({"random": {seed, low, high}} or {"file": ...})."""
    import numpy as np  # numpy: 0.2 s, not needed by doit list
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


TOLERANCE_KEYS = ("max_abs", "mean_abs", "cosine")  # required numbers
EPS = {"fp16": 2.0 ** -10, "int8": 2.0 ** -7}  # reduced precisions: their machine epsilon
SCALE_K = 4  # how many eps of golden's magnitude a reduced-precision output may be off
TOLERANCE_DEFAULTS = {"integer_steps": 0, "bool_mismatch": 0.0}  # optional


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def tolerance_problems(name: str, tolerance: dict):
    """The rule of a tolerance as `compare` takes it (the stages that compare with golden check
    their configs with it)."""
    keys, optional = set(tolerance), ", ".join(TOLERANCE_DEFAULTS)
    if not set(TOLERANCE_KEYS) <= keys <= {*TOLERANCE_KEYS, *TOLERANCE_DEFAULTS} or not all(
            _number(tolerance[k]) for k in TOLERANCE_KEYS):
        yield (f"{name} must give the numbers {', '.join(TOLERANCE_KEYS)} (and optionally "
               f"{optional}), got {tolerance!r}")
        return
    steps = tolerance.get("integer_steps", 0)
    if not (isinstance(steps, int) and not isinstance(steps, bool) and steps >= 0):
        yield f"{name}.integer_steps must be a whole number of steps, at least 0, got {steps!r}"
    fraction = tolerance.get("bool_mismatch", 0.0)
    if not (_number(fraction) and 0 <= fraction <= 1):
        yield f"{name}.bool_mismatch must be a fraction of the elements, 0 to 1, got {fraction!r}"


def integer_steps(tol: dict) -> tuple[int, str | None]:
    """How many steps an integer output may be off under `tol`, and where that came from:
    (integer_steps, "integer_steps") when the tolerance gives it, (max_abs, "max_abs") when it
    does not and max_abs is a whole number of at least 1, else (0, None): exact. A non-whole
    max_abs of 1 or more is integer_max_abs_problem's (it reads as 0 steps here: the caller
    has refused it)."""
    if "integer_steps" in tol:
        return tol["integer_steps"], "integer_steps"
    bound = tol["max_abs"]
    if bound >= 1 and float(bound).is_integer():
        return int(bound), "max_abs"
    return 0, None


def integer_max_abs_problem(name: str, tol: dict) -> str | None:
    """Why `tol` cannot judge an integer output (its max_abs >= 1 is no whole number of steps
    and integer_steps does not say how many), or None."""
    bound = tol["max_abs"]
    if "integer_steps" in tol or bound < 1 or float(bound).is_integer():
        return None
    return (f"{name}.max_abs {bound:g} is not a whole number of steps, and the model has an "
            f"integer output, which max_abs judges in steps (|difference| <= max_abs): give "
            f"{name}.integer_steps (e.g. {int(bound)}) for the integer outputs, or a whole max_abs")


def _kind(dtype) -> str:
    """Which rule judges an output of this dtype (see the module docstring)."""
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return "bool"
    return "integer" if np.issubdtype(dtype, np.integer) else "float"


def scaled(tol: dict, expected, precision: str | None) -> dict | None:
    """The bounds a float output computed in reduced `precision` is held to (see the module
    docstring), with how they were derived; None for fp32 (the declared bounds as they are)."""
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    if precision is None or precision == "fp32":
        return None
    eps = EPS[precision]
    e = np.abs(expected.astype(np.float64))
    e = e[np.isfinite(e)]  # a non-finite golden fails in any case (_floats)
    peak = float(e.max()) if e.size else 0.0
    mean = float(e.mean()) if e.size else 0.0
    return {"max_abs": max(tol["max_abs"], SCALE_K * eps * peak),
            "mean_abs": max(tol["mean_abs"], SCALE_K * eps * mean), "cosine": tol["cosine"],
            "precision": precision, "eps": eps, "k": SCALE_K,
            "golden_max_abs": peak, "golden_mean_abs": mean,
            "rule": "max_abs = max(declared max_abs, k * eps * golden_max_abs); mean_abs = "
                    "max(declared mean_abs, k * eps * golden_mean_abs)"}


def compare_one(name: str, actual: np.ndarray, expected: np.ndarray, tol: dict,
                precision: str | None = None) -> dict:
    """One output against its golden output: the row validation.json records. `precision`: the
    reduced precision the artifact computes in (fp16, int8), whose float bounds follow golden's
    magnitude; None: fp32, the declared bounds."""
    kind = _kind(expected.dtype)
    row = {"name": name, "shape": list(expected.shape), "dtype": str(expected.dtype),
           "compared": kind, "max_abs": None, "mean_abs": None, "cosine": None,
           "cosine_skipped": None, "failures": []}
    if actual.shape != expected.shape:
        row["failures"].append(f"shape {list(actual.shape)} != golden {list(expected.shape)}")
        return row
    if actual.dtype != expected.dtype:
        row["failures"].append(f"dtype {actual.dtype} != golden {expected.dtype}")
        if _kind(actual.dtype) != kind:
            return row
    declared = {**TOLERANCE_DEFAULTS, **tol}
    bounds = scaled(declared, expected, precision) if kind == "float" else None
    applied = declared if bounds is None else {**declared, "max_abs": bounds["max_abs"],
                                               "mean_abs": bounds["mean_abs"]}
    if bounds is not None:
        row["tolerance"] = bounds
    if kind == "integer":
        problem = integer_max_abs_problem("tolerance", tol)
        if problem is not None:
            row["failures"].append(problem)
            return row
        applied = {**applied, "integer_steps": integer_steps(tol)[0]}
        if integer_steps(tol)[1] == "max_abs":
            row.update(integer_steps=applied["integer_steps"], integer_steps_from="max_abs")
    judge = {"float": _floats, "integer": _integers, "bool": _bools}[kind]
    judge(row, actual.ravel(), expected.ravel(), applied)
    for k, failure in enumerate(row["failures"]):  # where a bound above the declared one came from
        metric = failure.split(" ", 1)[0]
        if bounds is not None and metric in ("max_abs", "mean_abs") and applied[metric] > declared[metric]:
            row["failures"][k] += (f" (= {SCALE_K} x {precision} eps {bounds['eps']:.3g} x golden's "
                                   f"{metric.split('_')[0]} magnitude {bounds['golden_' + metric]:.3g}; "
                                   f"declared {declared[metric]:.3g})")
    return row


def _floats(row: dict, actual, expected, tol: dict) -> None:
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    a, e = actual.astype(np.float64), expected.astype(np.float64)
    bad_a, bad_e = int(np.sum(~np.isfinite(a))), int(np.sum(~np.isfinite(e)))
    if bad_e:
        row["failures"].append(f"golden has {bad_e} non-finite values: no tolerance can judge them")
    if bad_a:
        row["failures"].append(f"{bad_a} non-finite values" + ("" if bad_e else " (golden has none)"))
    if bad_a or bad_e:
        return
    diff = np.abs(a - e)
    row["max_abs"] = float(diff.max()) if diff.size else 0.0
    row["mean_abs"] = float(diff.mean()) if diff.size else 0.0
    row["cosine_skipped"] = _why_no_cosine(e, tol)
    for metric in ("max_abs", "mean_abs"):
        if row[metric] > tol[metric]:
            row["failures"].append(f"{metric} {row[metric]:.3g} is above the tolerance "
                                   f"{tol[metric]:.3g}")
    if row["cosine_skipped"] is None:  # 7 digits: a cosine tolerance is 0.99999 or so
        row["cosine"] = _cosine(a, e)
        if row["cosine"] < tol["cosine"]:
            row["failures"].append(f"cosine {row['cosine']:.7g} is below the tolerance "
                                   f"{tol['cosine']:.7g}")


def _cosine(a, e) -> float:
    """Cosine similarity of `a` and of `e`, which is not all zeros. Each is scaled by its peak
    first: no overflow, and equal outputs give exactly 1. The sums are exactly rounded
    (math.fsum), not BLAS dot products: those add in an order that depends on the BLAS's thread
    count, and the same step on machines with other core counts (or under a Dask nanny, which
    sets one thread) wrote other last digits into validation.json."""

    import numpy as np  # numpy: 0.2 s, not needed by doit list
    peak = np.abs(a).max()
    if peak == 0:
        return 0.0
    a, e = (a / peak).ravel(), (e / np.abs(e).max()).ravel()

    def dot(x, y) -> float:
        return math.fsum((x * y).tolist())
    return float(np.clip(dot(a, e) / math.sqrt(dot(a, a) * dot(e, e)), -1, 1))


def _why_no_cosine(expected, tol: dict) -> str | None:
    """Why cosine cannot judge an output whose golden is `expected`; None when it can."""
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    if expected.size == 0:
        return "the output is empty: nothing to compare"
    peak, mean = float(np.abs(expected).max()), float(np.abs(expected).mean())
    if peak > tol["max_abs"] or mean > tol["mean_abs"]:
        return None
    return (f"golden is zero at the tolerance's resolution (largest magnitude {peak:.3g} <= "
            f"max_abs {tol['max_abs']:.3g}, mean {mean:.3g} <= mean_abs {tol['mean_abs']:.3g}): "
            f"its direction is noise, so max_abs and mean_abs judged the output, not cosine")


def _steps(actual, expected):
    """|actual - expected| per element of two integer arrays, exact for every integer dtype: the
    difference of the larger and the smaller, both taken modulo 2**64, is the true one."""
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    hi, lo = np.maximum(actual, expected), np.minimum(actual, expected)
    if hi.dtype.kind == "f":  # int64 beside uint64 (a dtype failure already): the nearest float
        return hi - lo
    return hi.astype(np.uint64) - lo.astype(np.uint64)


def _steps_text(n: int) -> str:
    return f"{n} step" if n == 1 else f"{n} steps"


def _integers(row: dict, actual, expected, tol: dict) -> None:
    steps, allowed, n = _steps(actual, expected), tol["integer_steps"], actual.size
    off, most = int((steps != 0).sum()), int(steps.max()) if n else 0
    source = (f" (the tolerance's max_abs {allowed} read as steps: integer_steps not given)"
              if row.get("integer_steps_from") == "max_abs" else "")
    row.update(max_abs=float(most), mean_abs=float(steps.mean()) if n else 0.0,
               cosine_skipped="integer output: compared element by element, "
                              + (f"within {_steps_text(allowed)}" if allowed else "exactly") + source,
               mismatches=off, mismatch_fraction=off / n if n else 0.0, max_steps=most)
    if most <= allowed:
        return
    row["failures"].append(
        f"{int((steps > allowed).sum())} of {n} elements differ by more than the tolerance's "
        f"{row.get('integer_steps_from', 'integer_steps')} {allowed} (by up to "
        f"{_steps_text(most)})" if allowed else
        f"{off} of {n} elements differ (by up to {_steps_text(most)}): an integer output must "
        f"match exactly (or within tolerance.integer_steps)")


def _bools(row: dict, actual, expected, tol: dict) -> None:
    allowed, n, off = tol["bool_mismatch"], actual.size, int((actual != expected).sum())
    fraction = off / n if n else 0.0
    row.update(max_abs=float(off > 0), mean_abs=fraction,
               cosine_skipped="bool output: compared by the fraction of elements that differ",
               mismatches=off, mismatch_fraction=fraction)
    if fraction <= allowed:
        return
    row["failures"].append(
        f"{off} of {n} elements differ ({fraction:.3g}), above the tolerance's bool_mismatch "
        f"{allowed:.3g}" if allowed else
        f"{off} of {n} elements differ: a bool output must match exactly (or within "
        f"tolerance.bool_mismatch)")


def compare(actual: list[np.ndarray], expected: list[np.ndarray], names: list[str],
            tol: dict, precision: str | None = None) -> dict:
    """Every output against golden (`precision`: see compare_one)."""
    if len(actual) != len(expected):
        return {"passed": False, "outputs": [],
                "failures": [f"{len(actual)} outputs, golden has {len(expected)}"]}
    rows = [compare_one(n, a, e, tol, precision) for n, a, e in zip(names, actual, expected)]
    return {"passed": all(not r["failures"] for r in rows), "outputs": rows}


def worst_cosine(rows: list[dict]) -> float | None:
    """The lowest cosine among the rows it judged; None when it judged none (integer, bool or
    near-zero outputs)."""
    return min((r["cosine"] for r in rows if r["cosine"] is not None), default=None)


def describe_failures(result: dict) -> str:
    lines = list(result.get("failures", []))
    for row in result["outputs"]:
        for failure in row["failures"]:
            lines.append(f"output {row['name']!r}: {failure}")
    return "; ".join(lines)


def _figures(row: dict) -> str:
    if "mismatches" in row:  # an integer or bool output
        steps = f", up to {_steps_text(row['max_steps'])}" if "max_steps" in row else ""
        return f"{row['mismatches']} of {math.prod(row['shape'])} elements differ{steps}"
    fmt = lambda v: "n/a" if v is None else f"{v:.3g}"
    cosine = "not used" if row.get("cosine_skipped") else (
        "n/a" if row["cosine"] is None else f"{row['cosine']:.7g}")
    return f"max_abs={fmt(row['max_abs'])} mean_abs={fmt(row['mean_abs'])} cosine={cosine}"


def summary(result: dict) -> str:
    """One line of figures, e.g. for progress output and error messages."""
    return "; ".join(f"{row['name']}: {_figures(row)}" for row in result["outputs"])
