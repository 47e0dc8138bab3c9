"""Generated control-flow graphs (If, Loop, sequences) and static-shape corner cases: the forms
real exporters emit, one small model per case, for the static stage's folding to a fixed point.

An If case nests `If`s 1 to 3 deep, the inner ones inside the branch the outer one takes (as
PyTorch's scripted exports and silero's decoder have them), each condition computed where its
If stands, from a different source: an input the spec binds to one value (`sr == 16000`), a
shape (`Shape -> Gather -> Greater`, or `Shape(start, end) -> Equal` from opset 15), constants,
or data (`ReduceSum(x) > 0`: must stay, and fail clearly). The branch not taken gives another
shape, so an If left in leaves a dynamic dim.

A Loop case varies where the trip count comes from (a constant, a bound input, a shape, data,
or none: a while loop whose condition counts against a shape) and what the body does (carried
values with scan outputs, one of them unused as tf2onnx leaves them; a TensorArray-like
sequence; an If on the iteration number; a Loop inside; nothing but constants).

A shape case is a tensor that is static although it may not look it: an empty `roi` Constant
of Resize (paddle2onnx's `p2o.helper.constant.*`), a zero-length slice, scalars (an input,
reductions to a scalar, a size gathered from a shape), and outputs of ops that onnx's shape
inference leaves unshaped though their value is computable (NonZero of a constant, Range and
TopK from shape arithmetic, Tile with computed repeats).

Each case gives the model, the spec's inputs (name, shape, dtype), the inputs it binds to one
value, and the feeds; onnxruntime on the original model is the reference.
"""
from __future__ import annotations

from dataclasses import dataclass

SOURCES = ("bound", "shape", "constant")
RATE = 16000
X_SHAPE = (2, 4)      # what the spec binds x ["N", "T"] to


def _np():
    import numpy as np
    return np


def _rng():
    return _np().random.default_rng(0)


def _const(name: str, value, dtype=None):
    """A Constant node `name` holding value (as exporters write small values)."""
    from onnx import helper, numpy_helper
    array = _np().array(value, dtype=dtype)
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(array, name),
                            name=name)


def _model(nodes, inputs, outputs, inits, opset: int):
    from onnx import helper
    graph = helper.make_graph(nodes, "control_flow", inputs, outputs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _x_input():
    from onnx import TensorProto, helper
    return helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "T"])


# ----------------------------------------------------------------------------- nested If
@dataclass(frozen=True)
class IfCase:
    sources: tuple = ("bound",)   # per level, outermost first: bound | shape | constant | data
    opset: int = 17

    @property
    def name(self) -> str:
        return f"if{len(self.sources)}-{'-'.join(self.sources)}-op{self.opset}"

    @property
    def data_dependent(self) -> bool:
        return "data" in self.sources

    @staticmethod
    def taken(level: int) -> str:
        """The branch each level takes: then, else, then, ... (the nested If lives there)."""
        return "then" if level % 2 == 0 else "else"

    def model(self):
        from onnx import TensorProto, helper, numpy_helper
        w = numpy_helper.from_array(_rng().standard_normal(X_SHAPE[1]).astype("float32"), "w")
        nodes, y = self._level(0, "y")
        return _model(nodes, [_x_input(), helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "?"])], [w],
                      self.opset)

    def _level(self, level: int, out: str) -> tuple[list, str]:
        """The nodes computing `out` at this level: its condition, then its If."""
        from onnx import TensorProto, helper
        p = f"l{level}_"
        if level == len(self.sources):  # the innermost value: Relu(x * w), [N, T]
            return [helper.make_node("Mul", ["x", "w"], [p + "xw"]),
                    helper.make_node("Relu", [p + "xw"], [out])], out
        nodes, cond = self._condition(level, p)
        inner, value = self._level(level + 1, p + "inner")
        taken = helper.make_graph(
            inner + [_const(p + "bias", float(level + 1), "float32"),
                     helper.make_node("Add", [value, p + "bias"], [p + "taken"])],
            p + "taken_branch", [], [helper.make_tensor_value_info(p + "taken", TensorProto.FLOAT, ["N", "T"])])
        other = helper.make_graph(
            [helper.make_node("Concat", ["x", "x"], [p + "other"], axis=1)], p + "other_branch", [],
            [helper.make_tensor_value_info(p + "other", TensorProto.FLOAT, ["N", "T2"])])
        then, els = (taken, other) if self.taken(level) == "then" else (other, taken)
        nodes.append(helper.make_node("If", [cond], [out], then_branch=then, else_branch=els,
                                      name=f"If_{level}"))
        return nodes, out

    def _condition(self, level: int, p: str) -> tuple[list, str]:
        """Nodes computing the condition of this level's If from its source, true exactly when
        the level takes its then branch."""
        from onnx import helper
        want = self.taken(level) == "then"
        source = self.sources[level]
        if source == "bound":
            return [_const(p + "rate", RATE if want else RATE // 2, "int64"),
                    helper.make_node("Equal", ["sr", p + "rate"], [p + "cond"])], p + "cond"
        if source == "shape" and self.opset >= 15:  # a [1]-shaped condition, as IREE dislikes
            return [helper.make_node("Shape", ["x"], [p + "t"], start=1, end=2),
                    _const(p + "size", [X_SHAPE[1] if want else X_SHAPE[1] + 1], "int64"),
                    helper.make_node("Equal", [p + "t", p + "size"], [p + "cond"])], p + "cond"
        if source == "shape":
            return [helper.make_node("Shape", ["x"], [p + "s"]), _const(p + "one", 1, "int64"),
                    helper.make_node("Gather", [p + "s", p + "one"], [p + "t"]),
                    _const(p + "two", 2, "int64"),
                    helper.make_node("Greater" if want else "Less", [p + "t", p + "two"], [p + "cond"])], p + "cond"
        if source == "constant":
            return [_const(p + "a", 3, "int64"), _const(p + "b", 2, "int64"),
                    helper.make_node("Greater" if want else "Less", [p + "a", p + "b"], [p + "cond"])], p + "cond"
        assert source == "data", source
        return [helper.make_node("ReduceSum", ["x"], [p + "sum"], keepdims=0),
                _const(p + "zero", 0.0, "float32"),
                helper.make_node("Greater", [p + "sum", p + "zero"], [p + "cond"])], p + "cond"

    def inputs(self) -> list[dict]:
        return [{"name": "x", "shape": list(X_SHAPE), "dtype": "float32"},
                {"name": "sr", "shape": [], "dtype": "int64"}]

    def constants(self) -> list[dict]:
        return [{"name": "sr", "value": RATE}]

    def feeds(self) -> dict:
        np = _np()
        return {"x": _rng().standard_normal(X_SHAPE).astype(np.float32),
                "sr": np.array(RATE, np.int64)}


def if_cases() -> list[IfCase]:
    """Depth 1-3, each level's source rotated so that every source sits at every depth, at
    opsets 13 and 18."""
    cases = []
    for opset in (13, 18):
        for depth in (1, 2, 3):
            for shift in range(len(SOURCES)):
                cases.append(IfCase(tuple(SOURCES[(shift + k) % 3] for k in range(depth)), opset))
    return cases


# ----------------------------------------------------------------------------- Loop
LOOP_X = (2, 3)   # x ["N", "T"] bound to this; T is the trip count from a shape
STEPS = 3         # the bound `steps` input


@dataclass(frozen=True)
class LoopCase:
    trip: str = "constant"   # constant | bound | shape | none (a while loop) | data | data-cond
    body: str = "scan"       # scan | sequence | if | nested | constant
    opset: int = 17

    @property
    def name(self) -> str:
        return f"loop-{self.trip}-{self.body}-op{self.opset}"

    @property
    def data_dependent(self) -> bool:
        return self.trip.startswith("data")

    def model(self):
        from onnx import TensorProto, helper
        nodes, m, cond, limit = self._trip()
        body_nodes, outs, loop_outs, after, graph_outs = getattr(self, f"_{self.body}")(limit)
        body = helper.make_graph(
            body_nodes + self._body_condition(limit), "body",
            [helper.make_tensor_value_info("i", TensorProto.INT64, []),
             helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
             *[self._carried_type(c) for c in self._carried()]],
            [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []), *outs])
        nodes += self._initial()
        nodes.append(helper.make_node("Loop", [m, cond] + [f"{c}_0" for c in self._carried()],
                                      loop_outs, body=body, name="loop"))
        return _model(nodes + after,
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "T"]),
                       helper.make_tensor_value_info("steps", TensorProto.INT64, [])],
                      [_tensor(o, ("M", "N", "T") if o.endswith("rows") else ("N", "T"))
                       for o in graph_outs], [], self.opset)

    def _trip(self) -> tuple[list, str, str, str]:
        """(nodes, M, cond, the name a while loop counts against)."""
        from onnx import TensorProto, helper
        if self.trip == "constant":
            return [_const("M", STEPS, "int64")], "M", "", ""
        if self.trip == "bound":
            return [helper.make_node("Identity", ["steps"], ["M"])], "M", "", ""
        if self.trip == "shape":
            return [helper.make_node("Shape", ["x"], ["s"]), _const("one", 1, "int64"),
                    helper.make_node("Gather", ["s", "one"], ["M"])], "M", "", ""
        if self.trip == "none":  # while (i + 1 < T): tf2onnx's form, M absent
            return [helper.make_node("Shape", ["x"], ["s"]), _const("one", 1, "int64"),
                    helper.make_node("Gather", ["s", "one"], ["T"]), _const("go", True, "bool")], "", "go", "T"
        if self.trip == "data":
            return [helper.make_node("ReduceMax", ["x"], ["mx"], keepdims=0),
                    helper.make_node("Abs", ["mx"], ["amx"]), _const("two", 2.0, "float32"),
                    helper.make_node("Add", ["amx", "two"], ["mx2"]),
                    helper.make_node("Cast", ["mx2"], ["M"], to=TensorProto.INT64)], "M", "", ""
        assert self.trip == "data-cond", self.trip
        return [_const("M", 5, "int64"), _const("go", True, "bool")], "M", "go", "data"

    def _body_condition(self, limit: str) -> list:
        from onnx import helper
        if limit == "data":  # go on while the accumulated values stay small: data
            return [helper.make_node("ReduceSum", ["acc"], ["acc_sum"], keepdims=0),
                    _const("cap", 4.0, "float32"),
                    helper.make_node("Less", ["acc_sum", "cap"], ["cond_out"])]
        if limit:
            return [_const("step", 1, "int64"), helper.make_node("Add", ["i", "step"], ["next"]),
                    helper.make_node("Less", ["next", limit], ["cond_out"])]
        return [helper.make_node("Identity", ["cond_in"], ["cond_out"])]

    def _carried(self) -> list[str]:
        return {"scan": ["acc"], "sequence": ["seq"], "if": ["acc"], "nested": ["acc"],
                "constant": ["table"]}[self.body]

    def _carried_type(self, name: str):
        from onnx import TensorProto, helper
        if name == "seq":
            return helper.make_tensor_sequence_value_info(name + "_in", TensorProto.FLOAT, ["N", "T"])
        return _tensor(name + "_in", [3] if name == "table" else ("N", "T"))

    def _initial(self) -> list:
        from onnx import TensorProto, helper
        if self.body == "sequence":
            return [helper.make_node("SequenceEmpty", [], ["seq_0"], dtype=TensorProto.FLOAT)]
        if self.body == "constant":
            return [_const("table_0", [1.0, 2.0, 3.0], "float32")]
        return [helper.make_node("Mul", ["x", "x"], ["acc_0"])]

    def _scaled_x(self, out: str) -> list:
        """x * (i + 1), the value an iteration contributes."""
        from onnx import TensorProto, helper
        return [helper.make_node("Cast", ["i"], [out + "_i"], to=TensorProto.FLOAT),
                _const(out + "_one", 1.0, "float32"),
                helper.make_node("Add", [out + "_i", out + "_one"], [out + "_k"]),
                helper.make_node("Mul", ["x", out + "_k"], [out])]

    def _scan(self, limit):
        """acc = acc / 2 + x (i + 1), carried and scanned (the same name twice); a second scan
        output nothing reads, as tf2onnx leaves them (`unused_loop_output___54`)."""
        from onnx import helper
        nodes = self._scaled_x("xi") + [
            _const("half", 0.5, "float32"), helper.make_node("Mul", ["acc_in", "half"], ["acc_h"]),
            helper.make_node("Add", ["acc_h", "xi"], ["acc"]),
            helper.make_node("Neg", ["acc"], ["unused"])]
        outs = [_tensor("acc"), _tensor("acc"), _tensor("unused")]
        return nodes, outs, ["acc_final", "acc_rows", "unused_loop_output___54"], [], ["acc_final", "acc_rows"]

    def _sequence(self, limit):
        """A TensorArray: SequenceInsert per iteration, then ConcatFromSequence (new axis),
        SequenceAt(-1) and SequenceLength after the loop."""
        from onnx import TensorProto, helper
        nodes = self._scaled_x("xi") + [helper.make_node("SequenceInsert", ["seq_in", "xi"], ["seq"])]
        outs = [helper.make_tensor_sequence_value_info("seq", TensorProto.FLOAT, ["N", "T"])]
        after = [helper.make_node("ConcatFromSequence", ["seq_final"], ["rows"], axis=0, new_axis=1),
                 _const("last", -1, "int64"),
                 helper.make_node("SequenceAt", ["seq_final", "last"], ["last_row"]),
                 helper.make_node("SequenceLength", ["seq_final"], ["count"]),
                 helper.make_node("Cast", ["count"], ["count_f"], to=TensorProto.FLOAT),
                 helper.make_node("Mul", ["last_row", "count_f"], ["scaled_last"])]
        return nodes, outs, ["seq_final"], after, ["rows", "scaled_last"]

    def _if(self, limit):
        """An If on the iteration number in the body: x at the first iteration, acc * 2 after."""
        from onnx import TensorProto, helper
        then = helper.make_graph([helper.make_node("Identity", ["x"], ["first"])], "first", [],
                                 [helper.make_tensor_value_info("first", TensorProto.FLOAT, ["N", "T"])])
        els = helper.make_graph([_const("twice", 2.0, "float32"),
                                 helper.make_node("Mul", ["acc_in", "twice"], ["later"])], "later", [],
                                [helper.make_tensor_value_info("later", TensorProto.FLOAT, ["N", "T"])])
        nodes = [_const("zero", 0, "int64"), helper.make_node("Equal", ["i", "zero"], ["is_first"]),
                 helper.make_node("If", ["is_first"], ["picked"], then_branch=then, else_branch=els,
                                  name="first_or_later"),
                 _const("inc", 1.0, "float32"), helper.make_node("Add", ["picked", "inc"], ["acc"])]
        return nodes, [_tensor("acc"), _tensor("picked")], ["acc_final", "picked_rows"], [], \
            ["acc_final", "picked_rows"]

    def _nested(self, limit):
        """A Loop in the body, its trip count N from x's shape (computed in the outer graph)."""
        from onnx import TensorProto, helper
        inner = helper.make_graph(
            [helper.make_node("Cast", ["j"], ["jf"], to=TensorProto.FLOAT),
             helper.make_node("Add", ["v_in", "jf"], ["v"]),
             helper.make_node("Identity", ["c_in"], ["c_out"])], "inner",
            [helper.make_tensor_value_info("j", TensorProto.INT64, []),
             helper.make_tensor_value_info("c_in", TensorProto.BOOL, []), _tensor("v_in")],
            [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []), _tensor("v")])
        nodes = [helper.make_node("Shape", ["x"], ["xs"]), _const("zero", 0, "int64"),
                 helper.make_node("Gather", ["xs", "zero"], ["n"]),
                 helper.make_node("Loop", ["n", "", "acc_in"], ["acc"], body=inner, name="inner_loop")]
        return nodes, [_tensor("acc"), _tensor("acc")], ["acc_final", "acc_rows"], [], ["acc_final", "acc_rows"]

    def _constant(self, limit):
        """Nothing but constants: folded into a table by value, never unrolled."""
        from onnx import helper
        nodes = [_const("double", 2.0, "float32"), helper.make_node("Mul", ["table_in", "double"], ["table"])]
        after = [_const("axes0", [0], "int64"),
                 helper.make_node("ReduceSum", ["rows", "axes0"], ["colsum"], keepdims=0),
                 helper.make_node("Add", ["x", "colsum"], ["y"])]
        return nodes, [_tensor("table", [3]), _tensor("table", [3])], ["table_final", "rows"], after, ["y"]

    def inputs(self) -> list[dict]:
        return [{"name": "x", "shape": list(LOOP_X), "dtype": "float32"},
                {"name": "steps", "shape": [], "dtype": "int64"}]

    def constants(self) -> list[dict]:
        return [{"name": "steps", "value": STEPS}]

    def feeds(self) -> dict:
        np = _np()
        return {"x": (_rng().standard_normal(LOOP_X) * 0.5).astype(np.float32),
                "steps": np.array(STEPS, np.int64)}


def _tensor(name: str, dims=("N", "T")):
    """A float value_info with the symbolic dims an exporter writes (onnx's checker wants a shape)."""
    from onnx import TensorProto, helper
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(dims))


def loop_cases() -> list[LoopCase]:
    """Every trip-count source with carried values and scan outputs, every body with a trip
    count from a shape; opsets 13 and 18."""
    cases = []
    for opset in (13, 18):
        cases += [LoopCase(trip, "scan", opset) for trip in ("constant", "bound", "shape", "none")]
        cases += [LoopCase("shape", body, opset) for body in ("sequence", "if", "nested")]
        cases += [LoopCase("bound", "constant", opset)]
    return cases


# ----------------------------------------------------------------------------- static shapes
@dataclass(frozen=True)
class ShapeCase:
    kind: str = "empty-roi"   # empty-roi | zero-dim | scalar | computable
    opset: int = 17

    @property
    def name(self) -> str:
        return f"shape-{self.kind}-op{self.opset}"

    def model(self):
        return getattr(self, "_" + self.kind.replace("-", "_"))()

    def _empty_roi(self):
        """paddle2onnx's Resize: roi an empty float Constant (`p2o.helper.constant.141`, [0])."""
        from onnx import TensorProto, helper
        roi = "p2o.helper.constant.141"
        nodes = [_const(roi, _np().zeros([0], "float32")),
                 _const("scales", [1.0, 1.0, 2.0, 2.0], "float32"),
                 helper.make_node("Resize", ["x", roi, "scales"], ["up"], mode="nearest"),
                 helper.make_node("Relu", ["up"], ["y"])]
        return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2, "H", "W"])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2, "H2", "W2"])], [],
                      self.opset)

    def _zero_dim(self):
        """A zero-length slice ([N, 0]) concatenated back, and an empty ConstantOfShape."""
        from onnx import TensorProto, helper
        nodes = [_const("start", [0], "int64"), _const("stop", [0], "int64"), _const("axis1", [1], "int64"),
                 helper.make_node("Slice", ["x", "start", "stop", "axis1"], ["none"]),
                 helper.make_node("Concat", ["x", "none"], ["same"], axis=1),
                 helper.make_node("Shape", ["none"], ["none_shape"]),
                 helper.make_node("ConstantOfShape", ["none_shape"], ["zeros"],
                                  value=_tensor_value(0.0)),
                 helper.make_node("Concat", ["same", "zeros"], ["y"], axis=1)]
        return _model(nodes, [_x_input()], [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "?"])],
                      [], self.opset)

    def _scalar(self):
        """A scalar integer input (data), a sum reduced to a scalar graph output, a size gathered
        from a shape as a scalar."""
        from onnx import TensorProto, helper
        nodes = [helper.make_node("Cast", ["k"], ["kf"], to=TensorProto.FLOAT),
                 helper.make_node("Mul", ["x", "kf"], ["xk"]),
                 helper.make_node("Shape", ["x"], ["s"]), _const("one", 1, "int64"),
                 helper.make_node("Gather", ["s", "one"], ["t"]),
                 helper.make_node("Cast", ["t"], ["tf"], to=TensorProto.FLOAT),
                 helper.make_node("Div", ["xk", "tf"], ["y"]),
                 helper.make_node("ReduceSum", ["y"], ["total"], keepdims=0)]
        return _model(nodes, [_x_input(), helper.make_tensor_value_info("k", TensorProto.INT64, [])],
                      [_tensor("y"), _tensor("total", [])], [], self.opset)

    def _computable(self):
        """Values shape inference cannot see through, but constant folding computes: NonZero of
        a constant mask, Range to a ReduceMax of the shape, TopK with k = T / 2, Tile with
        repeats concatenated from the shape."""
        from onnx import TensorProto, helper
        mask = _np().array([True, False, True, True])
        nodes = [_const("mask", mask), helper.make_node("NonZero", ["mask"], ["nz"]),
                 _const("axes0", [0], "int64"),
                 helper.make_node("Squeeze", ["nz", "axes0"], ["picked"]),
                 helper.make_node("Gather", ["x", "picked"], ["cols"], axis=1),
                 helper.make_node("Shape", ["x"], ["s"]),
                 helper.make_node("ReduceMax", ["s"], ["longest"], keepdims=0),
                 _const("zero", 0, "int64"), _const("one", 1, "int64"),
                 helper.make_node("Range", ["zero", "longest", "one"], ["ramp"]),
                 helper.make_node("Cast", ["ramp"], ["rampf"], to=TensorProto.FLOAT),
                 helper.make_node("Add", ["x", "rampf"], ["ramped"]),
                 helper.make_node("Gather", ["s", "one"], ["t"]), _const("two", 2, "int64"),
                 helper.make_node("Div", ["t", "two"], ["half"]),
                 helper.make_node("Unsqueeze", ["half", "axes0"], ["k"]),
                 helper.make_node("TopK", ["ramped", "k"], ["top", "top_i"]),
                 helper.make_node("Div", ["t", "t"], ["unit"]),
                 helper.make_node("Unsqueeze", ["unit", "axes0"], ["unit1"]),
                 helper.make_node("Concat", ["unit1", "k"], ["reps"], axis=0),
                 helper.make_node("Tile", ["top", "reps"], ["tiled"])]
        return _model(nodes, [_x_input()],
                      [_tensor("cols", ["N", "K"]), _tensor("tiled", ["N", "K2"])], [], self.opset)

    def inputs(self) -> list[dict]:
        if self.kind == "empty-roi":
            return [{"name": "x", "shape": [1, 2, 3, 5], "dtype": "float32"}]
        extra = [{"name": "k", "shape": [], "dtype": "int64"}] if self.kind == "scalar" else []
        return [{"name": "x", "shape": list(X_SHAPE), "dtype": "float32"}] + extra

    def constants(self) -> list[dict]:
        return []   # k of the scalar case is data: random in use

    def feeds(self) -> dict:
        np = _np()
        feeds = {i["name"]: _rng().standard_normal(i["shape"]).astype(np.float32)
                 for i in self.inputs() if i["dtype"] == "float32"}
        if self.kind == "scalar":
            feeds["k"] = np.array(3, np.int64)
        return feeds


def _tensor_value(value: float):
    from onnx import numpy_helper
    return numpy_helper.from_array(_np().array([value], "float32"), "value")


def shape_cases() -> list[ShapeCase]:
    return [ShapeCase(kind, opset) for opset in (13, 18)
            for kind in ("empty-roi", "zero-dim", "scalar", "computable")]
