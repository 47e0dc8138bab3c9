"""Folding to a fixed point, on generated families of graphs (tests/families/control_flow.py).

The contract: the static stage's model (static.make_static) gives what onnxruntime gives on the
ORIGINAL graph, with no If, Loop or sequence op left and every shape static; what was folded,
and from where (a bound input, a shape, constants), is recorded. Control flow that truly depends
on data fails, naming the node, the op and what it depends on. A few of each family go through
the stage itself (static.json) and IREE llvm-cpu for the host (compiled, run, checked against
golden), so the result is known to reach a compiler.
"""
from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h

from conftest import sha256
from families import control_flow as cf
from pipeline import graph
from pipeline.core.steps import execute
from pipeline.stages import iree_compile, static, validate

CONTROL_OPS = {"If", "Loop", "Scan", "SequenceEmpty", "SequenceInsert", "SequenceConstruct",
               "ConcatFromSequence", "SequenceAt", "SequenceLength"}
SAID = {"bound": "sr bound by the spec", "shape": "the shape of x", "constant": "a constant condition"}


def _run(model, feeds: dict) -> list:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"]).run(None, feeds)


def _ops(model) -> set[str]:
    """Op types at every depth (subgraphs included)."""
    found, todo = set(), [model.graph]
    while todo:
        g = todo.pop()
        for n in g.node:
            found.add(n.op_type)
            todo += [a.g for a in n.attribute if a.HasField("g")] + [s for a in n.attribute for s in a.graphs]
    return found


def _made_static(case):
    """(static model, its record) for a case, after checking it matches onnxruntime on the
    original graph output by output, with every dim static and no control flow left."""
    original = case.model()
    onnx.checker.check_model(original)
    expected = _run(original, case.feeds())
    model, made = static.make_static(case.model(), case.inputs(), case.constants())
    assert static.dynamic_tensors(model) == []
    assert not CONTROL_OPS & _ops(model), _ops(model)
    got = _run(model, case.feeds())
    assert [g.shape for g in got] == [e.shape for e in expected]
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-6, atol=1e-6)
    passes = made["folding"]
    assert [p["pass"] for p in passes] == list(range(1, len(passes) + 1))
    last = passes[-1]   # the fixed point: the last pass changed nothing
    assert last["folded"] == last["removed"] == 0 and "rewrites" not in last
    return model, made


def _rule(made, name) -> list[str]:
    return next((r["nodes"] for r in made["rewrites"] if r["rule"] == name), [])


# ----------------------------------------------------------------------------- If
@pytest.mark.parametrize("case", cf.if_cases(), ids=lambda c: c.name)
def test_nested_if_folds_level_by_level(case):
    """Each level's If folds once the one around it is inlined; one pass per level (plus the
    pass that finds nothing left); each record names where its condition came from."""
    _, made = _made_static(case)
    folded = _rule(made, "fold-constant-if")
    assert len(folded) == len(case.sources)
    for level, (node, source) in enumerate(zip(folded, case.sources)):
        assert node.startswith("__inl__".join(f"If_{k}" for k in range(level + 1)) + " (If: ")
        assert f"{case.taken(level)} taken, {SAID[source]})" in node
    assert len(made["folding"]) == len(case.sources) + 1
    assert made["folding"][0]["dynamic"] > 0   # the If left in the graph: its output is dynamic


@pytest.mark.parametrize("sources,node", [(("data",), "If_0"), (("bound", "data"), "If_0__inl__If_1"),
                                          (("shape", "constant", "data"), "If_0__inl__If_1__inl__If_2")])
def test_an_if_on_data_fails_naming_it(sources, node):
    """The levels above it fold; the If whose condition reads x's values is named, not a list of
    unknown shapes."""
    case = cf.IfCase(sources, 17)
    with pytest.raises(static.Refusal) as info:
        static.make_static(case.model(), case.inputs(), case.constants())
    what = info.value.what
    assert what.startswith("control flow that depends on data remains")
    assert f"If {node!r}: its condition " in what
    assert "depends on data at run time (the values of input x, through ReduceSum, Greater)" in what
    assert "bind it in the spec" in info.value.hint


@pytest.mark.parametrize("opset", [13, 18])
def test_a_where_on_a_shape_picks_its_operand(opset):
    """Where(T > 2, x, x + x): the condition is known once x's dims are bound; the broadcast
    shape stays that of the Where."""
    nodes = [h.make_node("Shape", ["x"], ["s"]), h.make_node("Gather", ["s", "one"], ["t"]),
             h.make_node("Greater", ["t", "two"], ["c"]), h.make_node("Add", ["x", "x"], ["xx"]),
             h.make_node("Where", ["c", "x", "xx"], ["y"], name="pick")]
    model = h.make_model(h.make_graph(
        nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, ["N", "T"])],
        [h.make_tensor_value_info("y", T.FLOAT, ["N", "T"])],
        [onnx.numpy_helper.from_array(np.array(v, np.int64), n) for n, v in (("one", 1), ("two", 2))]),
        opset_imports=[h.make_opsetid("", opset)])
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    expected = _run(model, {"x": x})[0]
    folded, made = static.make_static(model, [{"name": "x", "shape": [2, 4], "dtype": "float32"}])
    assert _rule(made, "fold-constant-if") == ["pick (Where: X taken, the shape of x)"]
    assert "Where" not in _ops(folded)
    np.testing.assert_array_equal(_run(folded, {"x": x})[0], expected)


# ----------------------------------------------------------------------------- Loop
@pytest.mark.parametrize("case", cf.loop_cases(), ids=lambda c: c.name)
def test_loop_unrolls_once_its_trip_count_is_known(case):
    _, made = _made_static(case)
    unrolled = _rule(made, "unroll-loop")
    how = {"constant": "a constant trip count", "bound": "steps bound by the spec",
           "shape": "the shape of x",
           "none": "until its condition turned false (the shape of x)"}[case.trip]
    assert unrolled[0] == f"loop (Loop: {cf.STEPS} iterations, {how})"
    if case.body == "nested":  # each copy of the inner Loop, unrolled in the next pass
        assert unrolled[1:] == [f"loop__it{i}__inner_loop (Loop: {cf.LOOP_X[0]} iterations, "
                                f"the shape of x)" for i in range(cf.STEPS)]
    if case.body == "if":      # the If on the iteration number, folded per unrolled iteration
        assert _rule(made, "fold-constant-if") == [
            f"loop__it{i}__first_or_later (If: {'then' if i == 0 else 'else'} taken, a constant "
            f"condition)" for i in range(cf.STEPS)]
    if case.body == "sequence":
        assert _rule(made, "fold-sequences") == [
            f"{out} ({op} of a sequence of {cf.STEPS} tensors)" for out, op in
            (("rows", "ConcatFromSequence"), ("last_row", "SequenceAt"), ("count", "SequenceLength"))]


def test_a_loop_of_constants_folds_to_a_constant():
    model, made = _made_static(cf.LoopCase("bound", "constant", 17))
    assert {n.op_type for n in model.graph.node} == {"Add"}   # x + the table's column sums


@pytest.mark.parametrize("trip,why", [
    ("data", "its trip count 'M' depends on data at run time (the values of input x, through "
             "ReduceMax, Abs, Add, Cast)"),
    ("data-cond", "its condition after iteration 0 ('cond_out') depends on data at run time")])
def test_a_loop_on_data_fails_naming_it(trip, why):
    case = cf.LoopCase(trip, "scan", 18)
    with pytest.raises(static.Refusal) as info:
        static.make_static(case.model(), case.inputs(), case.constants())
    assert f"Loop 'loop': {why}; its outputs acc_final, acc_rows, unused_loop_output___54 have " \
           f"no static shape" in info.value.what


def test_too_many_iterations_are_declined_with_the_reason():
    from pipeline.rewrite import loops
    case = cf.LoopCase("bound", "scan", 17)
    inputs = case.inputs()
    with pytest.raises(static.Refusal) as info:
        static.make_static(case.model(), inputs, [{"name": "steps", "value": loops.MAX_ITERATIONS + 1}])
    assert (f"Loop 'loop': its trip count {loops.MAX_ITERATIONS + 1} asks for "
            f"{loops.MAX_ITERATIONS + 1} iterations of 9 nodes; at most {loops.MAX_ITERATIONS} "
            f"iterations") in info.value.what


# ----------------------------------------------------------------------------- static shapes
@pytest.mark.parametrize("case", cf.shape_cases(), ids=lambda c: c.name)
def test_static_shapes_are_never_reported_dynamic(case):
    model, _ = _made_static(case)
    if case.kind == "computable":
        assert not {"NonZero", "Range"} & _ops(model)   # computed, then static


def test_a_zero_length_dim_is_static():
    """dim_value 0 is a length (an empty roi), not an unknown dim."""
    vi = h.make_tensor_value_info("p2o.helper.constant.141", T.FLOAT, [0])
    unknown = h.make_tensor_value_info("u", T.FLOAT, [None])
    assert static._dims(vi) == [0] and static._dims(unknown) == ["?"]


# ----------------------------------------------------------------------------- the stage, IREE
def _spec(folder, case, low=-1.0, high=1.0) -> None:
    bound = {c["name"]: c["value"] for c in case.constants()}
    lines = ["description: generated control-flow case", "source:", "  path: model.onnx",
             f"  sha256: {sha256(folder / 'model.onnx')}", "inputs:"]
    for i in case.inputs():
        lo, hi = (bound[i["name"]],) * 2 if i["name"] in bound else (low, high)
        lines += [f"  {i['name']}:", f"    shape: {i['shape']}", f"    dtype: {i['dtype']}",
                  f"    test_data: {{random: {{seed: 0, low: {lo}, high: {hi}}}}}"]
    lines.append("tolerance: {max_abs: 1.0e-5, mean_abs: 1.0e-6, cosine: 0.99999}")
    (folder / "model.yaml").write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("case", [cf.IfCase(("bound", "shape", "constant"), 18),
                                  cf.LoopCase("shape", "sequence", 13)], ids=lambda c: c.name)
def test_the_stage_records_the_passes_and_iree_runs_the_result(tmp_path, case):
    folder = tmp_path / "models" / "case"
    folder.mkdir(parents=True)
    onnx.save(case.model(), folder / "model.onnx")
    _spec(folder, case)
    proj = graph.load_project(tmp_path / "models", tmp_path / "artifacts", "host")
    model = next(m for m in proj.models if m.name == "case")
    host = next(t for t in proj.targets if t.name == "host")
    abi = next(a for a in host.abis if a.name == "cpu-x86_64")
    steps = [next(s for s in proj.steps(stage) if s.name == "case") for stage in ("import", "golden", "static")]
    steps += [iree_compile.compile_step(proj.layout, model, host, abi),
              validate.validate_step(proj.layout, model, host, abi)]
    for step in steps:
        execute(step)
    report = json.loads((steps[2].out_dir / "static.json").read_text())
    assert report["folding"] and report["folding"][-1]["folded"] == 0
    assert report["vs_original"]["passed"]
    assert not CONTROL_OPS & set(report["ops"])
    checked = json.loads((steps[-1].out_dir / "validation.json").read_text())
    assert checked["status"] == "passed"
    assert max(o["max_abs"] for o in checked["outputs"]) < 1e-5
