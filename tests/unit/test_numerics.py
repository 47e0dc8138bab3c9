"""core.numerics: how an artifact's outputs are judged against golden, one table row per metric
and edge (pure numpy, milliseconds).

Float outputs: max_abs, mean_abs and cosine, cosine left out (and said so) where golden is within
max_abs of zero; integer outputs exactly or in steps; bool outputs by the fraction that differs;
shapes, dtypes and non-finite values fail. Then the tolerance's rule and the spec that feeds it.
"""
from __future__ import annotations

import numpy as np
import pytest
import yaml
from pydantic import ValidationError

from pipeline.core.numerics import (compare, compare_one, describe_failures,
                                    integer_max_abs_problem, integer_steps, summary,
                                    tolerance_problems, worst_cosine)
from pipeline.spec.common import ToleranceDoc

TOL = {"max_abs": 1e-4, "mean_abs": 1e-5, "cosine": 0.9999}
RNG = np.random.default_rng(0)
SIGNAL = RNG.uniform(-1, 1, 64).astype(np.float32)
ZEROS = np.zeros((1, 1, 8, 8), np.float32)


def noisy(x, scale, seed=1):
    return (x + np.random.default_rng(seed).uniform(-scale, scale, x.shape)).astype(x.dtype)


def at(x, index, value):
    """`x` with one element set: a copy."""
    y = x.copy()
    y.flat[index] = value
    return y


U8 = np.array([0, 10, 20, 128, 200, 250, 254, 255], np.uint8)
MASK = np.array([True, False, True, True])

# (id, actual, expected, tolerance overrides, passes, a failure must contain / None, row fields)
CASES = [
    ("float equal", SIGNAL, SIGNAL, {}, True, None,
     {"compared": "float", "max_abs": 0.0, "mean_abs": 0.0, "cosine": 1.0, "cosine_skipped": None}),
    ("float noise within tolerance", noisy(SIGNAL, 1e-6), SIGNAL, {}, True, None,
     {"cosine_skipped": None}),
    ("float max_abs above", at(SIGNAL, 3, SIGNAL[3] + 0.01), SIGNAL, {}, False,
     "max_abs 0.01 is above the tolerance 0.0001", {"cosine_skipped": None}),
    ("float mean_abs above", noisy(SIGNAL, 9e-5), SIGNAL, {}, False,
     "is above the tolerance 1e-05", {}),
    ("float direction off, abs bounds loose", noisy(SIGNAL, 0.3), SIGNAL,
     {"max_abs": 0.5, "mean_abs": 0.5}, False, "is below the tolerance 0.9999",
     {"cosine_skipped": None}),
    ("float signal vs all zeros", np.zeros_like(SIGNAL), SIGNAL, {}, False,
     "cosine 0 is below the tolerance", {"cosine": 0.0}),
    ("zeros vs zeros", ZEROS, ZEROS, {}, True, None,
     {"max_abs": 0.0, "cosine": None}),
    ("zeros golden, tiny noise within max_abs", at(ZEROS, 5, 7.94e-9), ZEROS, {}, True, None,
     {"cosine": None}),
    # the issue's segmentation output: golden ~8e-9, the artifact all zeros; was "cosine 0"
    ("tiny golden, zeros artifact", ZEROS, at(ZEROS, 5, 7.94e-9), {}, True, None,
     {"max_abs": pytest.approx(7.94e-9), "cosine": None}),
    ("zeros golden, artifact above max_abs", at(ZEROS, 5, 1e-3), ZEROS, {}, False,
     "max_abs 0.001 is above the tolerance 0.0001", {"cosine": None}),
    ("zeros golden, many small values above mean_abs", np.full_like(ZEROS, 5e-5), ZEROS, {},
     False, "mean_abs 5e-05 is above the tolerance 1e-05", {"cosine": None}),
    ("golden peak at max_abs: cosine not used", np.array([0.0, 1.0]), np.array([1.0, 0.0]),
     {"max_abs": 1.0, "mean_abs": 1.0, "cosine": 0.9}, True, None, {"cosine": None}),
    ("golden within max_abs, its mean above mean_abs: cosine used",
     np.full(64, 5e-5) + np.resize([9e-6, -9e-6], 64), np.full(64, 5e-5), {}, False,
     "cosine 0.98", {"cosine": pytest.approx(5 / np.hypot(5, 0.9)), "max_abs": pytest.approx(9e-6)}),
    ("golden peak above max_abs: cosine used", np.array([0.5, 1.0]), np.array([1.5, 0.0]),
     {"max_abs": 1.0, "mean_abs": 1.0, "cosine": 0.9}, False, "is below the tolerance 0.9",
     {"cosine": pytest.approx(0.75 / (1.5 * np.hypot(0.5, 1.0))), "cosine_skipped": None}),
    ("float empty", np.zeros((0, 4), np.float32), np.zeros((0, 4), np.float32), {}, True, None,
     {"max_abs": 0.0, "mean_abs": 0.0, "cosine": None}),
    ("NaN in the artifact", at(SIGNAL, 0, np.nan), SIGNAL, {}, False,
     "1 non-finite values (golden has none)", {"max_abs": None, "cosine": None}),
    ("NaN in golden", SIGNAL, at(SIGNAL, 0, np.nan), {}, False,
     "golden has 1 non-finite values", {"max_abs": None}),
    ("inf on both sides", at(SIGNAL, 0, np.inf), at(SIGNAL, 0, np.inf), {}, False,
     "non-finite", {}),
    ("shape differs", SIGNAL[:10], SIGNAL, {}, False, "shape [10] != golden [64]",
     {"max_abs": None}),
    ("float dtype differs: figures still given", SIGNAL.astype(np.float16), SIGNAL, {}, False,
     "dtype float16 != golden float32", {"max_abs": pytest.approx(0.0, abs=1e-3)}),
    ("int equal", np.arange(6), np.arange(6), {}, True, None,
     {"compared": "integer", "mismatches": 0, "mismatch_fraction": 0.0, "max_steps": 0,
      "cosine": None}),
    ("uint8 one step off, exact", at(at(U8, 1, 11), 3, 127), U8, {}, False,
     "2 of 8 elements differ (by up to 1 step): an integer output must match exactly",
     {"mismatches": 2, "mismatch_fraction": 0.25, "max_steps": 1, "max_abs": 1.0}),
    ("uint8 one step off, one allowed", at(at(U8, 1, 11), 3, 127), U8, {"integer_steps": 1}, True,
     None, {"mismatches": 2, "mismatch_fraction": 0.25, "max_steps": 1}),
    ("uint8 two steps off, one allowed", at(at(U8, 1, 11), 3, 130), U8, {"integer_steps": 1},
     False, "1 of 8 elements differ by more than the tolerance's integer_steps 1 (by up to 2 steps)",
     {"mismatches": 2, "max_steps": 2}),
    ("integer ignores the float tolerance", at(U8, 0, 1), U8,
     {"integer_steps": 1, "max_abs": 0.0, "mean_abs": 0.0, "cosine": 1.0}, True, None,
     {"max_steps": 1}),
    # issue 40: `max_abs: 4` for a uint8 output means steps (integer_steps not given)
    ("uint8 three steps off, max_abs 4 read as steps", at(U8, 1, 13), U8, {"max_abs": 4}, True,
     None, {"integer_steps": 4, "integer_steps_from": "max_abs", "max_steps": 3}),
    ("uint8 five steps off, max_abs 4 read as steps", at(U8, 1, 15), U8, {"max_abs": 4.0}, False,
     "1 of 8 elements differ by more than the tolerance's max_abs 4 (by up to 5 steps)",
     {"integer_steps_from": "max_abs"}),
    ("integer_steps given wins over max_abs", at(U8, 1, 13), U8, {"max_abs": 4, "integer_steps": 1},
     False, "integer_steps 1", {"max_steps": 3}),
    ("integer_steps 0 given keeps it exact", at(U8, 1, 11), U8, {"max_abs": 4, "integer_steps": 0},
     False, "must match exactly", {}),
    ("max_abs below 1 leaves integers exact", at(U8, 1, 11), U8, {"max_abs": 0.5}, False,
     "must match exactly", {}),
    ("max_abs 2.5 is no number of steps", U8, U8, {"max_abs": 2.5}, False,
     "tolerance.max_abs 2.5 is not a whole number of steps", {"max_abs": None}),
    ("int8 extremes, no overflow", np.array([127], np.int8), np.array([-128], np.int8), {}, False,
     "by up to 255 steps", {"max_steps": 255}),
    ("int64 extremes", np.array([2**63 - 1]), np.array([-2**63]), {}, False, "differ",
     {"max_steps": 2**64 - 1}),
    ("uint64 extremes", np.array([2**64 - 1], np.uint64), np.array([0], np.uint64), {}, False,
     "differ", {"max_steps": 2**64 - 1}),
    ("int empty", np.zeros(0, np.int64), np.zeros(0, np.int64), {}, True, None,
     {"mismatches": 0, "mismatch_fraction": 0.0, "max_steps": 0}),
    ("int golden, float artifact: no figures", np.arange(4.0), np.arange(4), {}, False,
     "dtype float64 != golden int64", {"max_abs": None, "compared": "integer"}),
    ("int32 artifact, int64 golden: figures still given", np.arange(4, dtype=np.int32),
     np.arange(4), {}, False, "dtype int32 != golden int64", {"mismatches": 0}),
    ("bool equal", MASK, MASK, {}, True, None,
     {"compared": "bool", "mismatches": 0, "mismatch_fraction": 0.0, "max_abs": 0.0,
      "cosine": None}),
    ("bool one differs, exact", at(MASK, 1, True), MASK, {}, False,
     "1 of 4 elements differ: a bool output must match exactly",
     {"mismatches": 1, "mismatch_fraction": 0.25, "max_abs": 1.0, "mean_abs": 0.25}),
    ("bool one differs, a quarter allowed", at(MASK, 0, False), MASK, {"bool_mismatch": 0.25},
     True, None, {"mismatches": 1}),
    ("bool one differs, a fifth allowed", at(MASK, 0, False), MASK, {"bool_mismatch": 0.2},
     False, "1 of 4 elements differ (0.25), above the tolerance's bool_mismatch 0.2", {}),
    ("bool empty", np.zeros(0, bool), np.zeros(0, bool), {}, True, None, {"mismatch_fraction": 0.0}),
]


@pytest.mark.parametrize("actual, expected, tol, passes, failure, fields",
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_compare_one(actual, expected, tol, passes, failure, fields):
    row = compare_one("y", actual, expected, {**TOL, **tol})
    assert {"name", "shape", "dtype", "compared", "max_abs", "mean_abs", "cosine",
            "cosine_skipped", "failures"} <= set(row)
    assert (row["failures"] == []) is passes, row["failures"]
    if failure is not None:
        assert any(failure in f for f in row["failures"]), row["failures"]
    for key, value in fields.items():
        assert row[key] == value, (key, row[key])


@pytest.mark.parametrize("actual, expected, why", [
    (at(ZEROS, 5, 7.94e-9), ZEROS, "golden is zero at the tolerance's resolution (largest "
                                   "magnitude 0 <= max_abs 0.0001, mean 0 <= mean_abs 1e-05): "
                                   "its direction is noise, so max_abs and mean_abs judged the "
                                   "output, not cosine"),
    (ZEROS, at(ZEROS, 5, 7.94e-9), "largest magnitude 7.94e-09 <= max_abs 0.0001, mean 1.24e-10"),
    (np.zeros(0), np.zeros(0), "the output is empty"),
    (np.arange(3), np.arange(3), "integer output: compared element by element, exactly"),
    (MASK, MASK, "bool output: compared by the fraction of elements that differ"),
])
def test_a_skipped_cosine_says_why(actual, expected, why):
    row = compare_one("y", actual, expected, TOL)
    assert row["cosine"] is None and why in row["cosine_skipped"]


def test_the_skip_is_in_the_summary_and_passed_rows_feed_the_manifest():
    result = compare([at(ZEROS, 5, 7.94e-9), SIGNAL, at(U8, 1, 11)], [ZEROS, SIGNAL, U8],
                     ["mask", "logits", "q"], {**TOL, "integer_steps": 1})
    assert result["passed"]
    assert summary(result) == ("mask: max_abs=7.94e-09 mean_abs=1.24e-10 cosine=not used; "
                               "logits: max_abs=0 mean_abs=0 cosine=1; "
                               "q: 1 of 8 elements differ, up to 1 step")
    assert worst_cosine(result["outputs"]) == 1.0  # the cosine that judged
    assert max(r["max_abs"] for r in result["outputs"]) == 1.0  # one step of q


def test_worst_cosine_is_none_when_cosine_judged_nothing():
    rows = compare([ZEROS, MASK], [ZEROS, MASK], ["a", "b"], TOL)["outputs"]
    assert worst_cosine(rows) is None
    rows = compare([SIGNAL, noisy(SIGNAL, 1e-3)], [SIGNAL, SIGNAL], ["a", "b"], TOL)["outputs"]
    assert worst_cosine(rows) == min(r["cosine"] for r in rows) < 1.0


def test_compare_names_each_failing_output():
    result = compare([SIGNAL, np.arange(3) + 1], [SIGNAL, np.arange(3)], ["ok", "ids"], TOL)
    assert not result["passed"]
    assert describe_failures(result) == ("output 'ids': 3 of 3 elements differ (by up to 1 step): "
                                         "an integer output must match exactly (or within "
                                         "tolerance.integer_steps)")
    short = compare([SIGNAL], [SIGNAL, SIGNAL], ["a", "b"], TOL)
    assert not short["passed"] and describe_failures(short) == "1 outputs, golden has 2"


@pytest.mark.parametrize("tolerance, problem", [
    (TOL, None),
    ({**TOL, "integer_steps": 2, "bool_mismatch": 0.01}, None),
    ({"max_abs": 1, "mean_abs": 1, "cosine": 1}, None),
    ({"max_abs": 1e-4, "mean_abs": 1e-5}, "must give the numbers max_abs, mean_abs, cosine"),
    ({**TOL, "rtol": 1e-3}, "(and optionally integer_steps, bool_mismatch)"),
    ({**TOL, "cosine": True}, "must give the numbers"),
    ({**TOL, "integer_steps": 1.5}, "integer_steps must be a whole number of steps, at least 0, got 1.5"),
    ({**TOL, "integer_steps": -1}, "integer_steps must be a whole number"),
    ({**TOL, "integer_steps": True}, "integer_steps must be a whole number"),
    ({**TOL, "bool_mismatch": 2}, "bool_mismatch must be a fraction of the elements, 0 to 1, got 2"),
])
def test_tolerance_problems(tolerance, problem):
    problems = list(tolerance_problems("tolerance", tolerance))
    if problem is None:
        assert problems == []
    else:
        assert len(problems) == 1 and problem in problems[0] and problems[0].startswith("tolerance")


def test_integer_max_abs_reads_as_steps_and_the_row_says_so():
    row = compare_one("q", at(U8, 1, 13), U8, {**TOL, "max_abs": 4})
    assert "within 4 steps (the tolerance's max_abs 4 read as steps" in row["cosine_skipped"]
    assert integer_steps({**TOL, "max_abs": 4}) == (4, "max_abs")
    assert integer_steps({**TOL, "max_abs": 4, "integer_steps": 2}) == (2, "integer_steps")
    assert integer_steps(TOL) == (0, None)
    assert integer_max_abs_problem("tolerance", {**TOL, "max_abs": 1.5}).startswith(
        "tolerance.max_abs 1.5 is not a whole number of steps")
    assert integer_max_abs_problem("tolerance", {**TOL, "max_abs": 1.5, "integer_steps": 1}) is None
    # a float output keeps max_abs as it is
    assert compare_one("f", SIGNAL + 3, SIGNAL, {**TOL, "max_abs": 4})["failures"] != []


def _spec(tmp_path, tolerance: dict, out_dtype: int):
    """A one-Identity ONNX model (float input, an output of `out_dtype` through Cast) and its
    model.yaml with `tolerance`; what load_model makes of them."""
    import onnx
    from onnx import TensorProto, helper
    from pipeline.core.store import sha256_file
    from pipeline.spec.model import load_model
    folder = tmp_path / "models" / "q"
    folder.mkdir(parents=True)
    graph = helper.make_graph([helper.make_node("Cast", ["x"], ["y"], to=out_dtype)], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", out_dtype, [1, 4])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
              folder / "q.onnx")
    spec = {"source": {"path": "q.onnx", "sha256": sha256_file(folder / "q.onnx")},
            "inputs": {"x": {"shape": [1, 4], "dtype": "float32"}}, "tolerance": tolerance}
    (folder / "model.yaml").write_text(yaml.safe_dump(spec))
    return load_model(folder / "model.yaml")


def test_a_non_whole_max_abs_for_an_integer_output_is_a_spec_error(tmp_path):
    from onnx import TensorProto
    specs, problems = _spec(tmp_path, {**TOL, "max_abs": 2.5}, TensorProto.UINT8)
    assert specs is None and len(problems) == 1
    assert ("tolerance.max_abs 2.5 is not a whole number of steps" in problems[0]
            and "integer outputs: y" in problems[0]), problems


@pytest.mark.parametrize("tolerance, out_dtype, recorded", [
    ({**TOL, "max_abs": 4}, "UINT8", {**TOL, "max_abs": 4}),  # compare reads it as 4 steps
    ({**TOL, "max_abs": 2.5}, "FLOAT", {**TOL, "max_abs": 2.5}),  # no integer output: a float bound
    ({**TOL, "max_abs": 2.5, "integer_steps": 2}, "UINT8", {**TOL, "max_abs": 2.5, "integer_steps": 2}),
    ({**TOL, "integer_steps": 0}, "UINT8", {**TOL, "integer_steps": 0}),  # a given 0 is recorded
])
def test_specs_that_say_how_integer_outputs_are_judged_load(tmp_path, tolerance, out_dtype, recorded):
    from onnx import TensorProto
    specs, problems = _spec(tmp_path, tolerance, getattr(TensorProto, out_dtype))
    assert problems == [] and specs[0].tolerance.as_dict() == recorded


def test_the_spec_gives_what_compare_takes():
    plain = ToleranceDoc.model_validate(TOL).spec().as_dict()
    assert plain == TOL  # no optional key: the records and step keys of every spec stay as they were
    given = ToleranceDoc.model_validate({**TOL, "integer_steps": 1, "bool_mismatch": 0.5})
    assert given.spec().as_dict() == {**TOL, "integer_steps": 1, "bool_mismatch": 0.5}
    assert list(tolerance_problems("tolerance", given.spec().as_dict())) == []
    for bad in ({"integer_steps": -1}, {"integer_steps": 1.5}, {"bool_mismatch": 1.5}):
        with pytest.raises(ValidationError):
            ToleranceDoc.model_validate({**TOL, **bad})



def test_cosine_does_not_depend_on_the_blas_thread_count():
    """The cosine's sums are exactly rounded: the same outputs give the same last digit whatever
    the BLAS's threads (a Dask nanny sets one, a bigger machine uses more; numpy's dot product of
    these arrays differs in its 15th digit between 1 and 2 OpenBLAS threads)."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    code = ("import numpy as np; from pipeline.core.numerics import _cosine; "
            "r = np.random.default_rng(0); e = r.standard_normal(300_000); "
            "a = e + 1e-3 * r.standard_normal(300_000); print(repr(_cosine(a, e)))")
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           cwd=Path(__file__).resolve().parents[2],
                           env={**os.environ, "OPENBLAS_NUM_THREADS": n, "OMP_NUM_THREADS": n}).stdout
            for n in ("1", "2", "4")}
    assert len(outs) == 1, outs
