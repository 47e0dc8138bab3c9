"""Generated graphs for three classes real models bring to the static stage (issue 40):

- `InitInputCase`: graph inputs that are also initializers, as old PyTorch exports (IR 3/4,
  opset 9) list every weight, BatchNorm's `num_batches_tracked` included (read by nothing);
  the defaults are weights (Conv, BatchNormalization), an unread counter, or a value the spec
  may declare as an input (a scale);
- `MapFnCase`: tf.map_fn / tf.while_loop as tf2onnx writes it: a Loop with trip count 2^63 - 1
  and a condition `counter < n` computed in the body, n the mapped length (from a shape, from an
  input the spec binds, or a constant of the body), the counter the iteration number or a
  carried value, the condition alone or `LogicalAnd(counter < max_iterations, i < n)` as TF2's
  while_v2 writes it;
- `EncoderCase`: a small BERT-like encoder as exporters write it: embeddings Gathered, position
  ids from `Range(0, Shape->Gather)`, Expand to the batch, an attention mask Unsqueezed and
  Expanded to [B, H, S, S], heads split by Reshape with shapes built by Shape -> Gather ->
  Unsqueeze -> Concat, scaled by Sqrt of a dim read from a shape, Softmax, heads merged, Erf
  GELU, LayerNormalization, mean pooling; the shape chains are where onnx's own inference
  stops when a value along them is not folded (`shapes`: how the exporter wrote them).

Each case gives the model, the spec's inputs (name, shape, dtype), the inputs it binds to one
value, and the feeds; onnxruntime on the original model is the reference.
"""
from __future__ import annotations

from dataclasses import dataclass

from .control_flow import _const, _np, _rng  # the same small-graph helpers

INT64_MAX = 2 ** 63 - 1


def _w(name: str, *shape, scale=0.3, offset=0.0):
    from onnx import numpy_helper
    np = _np()
    value = (np.random.default_rng(len(name) * 7 + sum(shape)).standard_normal(shape) * scale + offset)
    return numpy_helper.from_array(value.astype(np.float32), name)


# ----------------------------------------------------------------------------- initializer inputs
@dataclass(frozen=True)
class InitInputCase:
    declared: bool = False   # the spec declares `scale` (an initializer input) as an input
    ir: int = 4
    opset: int = 9

    @property
    def name(self) -> str:
        return f"init-inputs-{'declared' if self.declared else 'defaults'}-ir{self.ir}-op{self.opset}"

    def model(self):
        """x -> Conv -> BatchNormalization -> Relu -> Mul(scale): every weight a graph input
        with an initializer, and an unread `bn.num_batches_tracked` (int64 scalar)."""
        from onnx import TensorProto, helper, numpy_helper
        np = _np()
        c = 4
        inits = [_w("conv.weight", c, 3, 3, 3, scale=0.2), _w("conv.bias", c, scale=0.1),
                 _w("bn.weight", c, scale=0.1, offset=1.0), _w("bn.bias", c, scale=0.1),
                 _w("bn.running_mean", c, scale=0.1),
                 numpy_helper.from_array((np.abs(_rng().standard_normal(c)) + 0.5).astype(np.float32),
                                         "bn.running_var"),
                 numpy_helper.from_array(np.array(0, np.int64), "bn.num_batches_tracked"),
                 numpy_helper.from_array(np.array([2.0], np.float32), "scale")]
        nodes = [helper.make_node("Conv", ["x", "conv.weight", "conv.bias"], ["c"], pads=[1, 1, 1, 1],
                                  kernel_shape=[3, 3]),
                 helper.make_node("BatchNormalization", ["c", "bn.weight", "bn.bias", "bn.running_mean",
                                                         "bn.running_var"], ["b"], epsilon=1e-5),
                 helper.make_node("Relu", ["b"], ["r"]),
                 helper.make_node("Mul", ["r", "scale"], ["y"])]
        if self.opset < 7:
            nodes[1].attribute.append(helper.make_attribute("consumed_inputs", [0, 0, 0, 1, 1]))
        inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])]
        inputs += [helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in inits]
        graph = helper.make_graph(nodes, "torch-jit-export", inputs,
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", c, 8, 8])],
                                  initializer=inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)],
                                  producer_name="pytorch", producer_version="1.1")
        model.ir_version = self.ir
        return model

    def inputs(self) -> list[dict]:
        return [{"name": "x", "shape": [1, 3, 8, 8], "dtype": "float32"}] + (
            [{"name": "scale", "shape": [1], "dtype": "float32"}] if self.declared else [])

    def constants(self) -> list[dict]:
        return []

    def feeds(self) -> dict:
        np = _np()
        feeds = {"x": _rng().standard_normal((1, 3, 8, 8)).astype(np.float32)}
        if self.declared:
            feeds["scale"] = np.array([-0.5], np.float32)
        return feeds


def init_input_cases() -> list[InitInputCase]:
    return [InitInputCase(False, 3, 9), InitInputCase(False, 4, 9), InitInputCase(True, 4, 9),
            InitInputCase(False, 7, 13)]


# ----------------------------------------------------------------------------- tf.map_fn
MAP_X = (3, 4)   # x [N, T] bound to this: N elements mapped


@dataclass(frozen=True)
class MapFnCase:
    n: str = "shape"          # shape | bound | body (a constant of the body) | data
    counter: str = "carried"  # carried (tf2onnx's loop variable) | iteration (the Loop's own)
    cond: str = "less"        # less | and (while_v2: counter < max_iterations and i < n)
    opset: int = 13

    @property
    def name(self) -> str:
        return f"mapfn-{self.n}-{self.counter}-{self.cond}-op{self.opset}"

    def model(self):
        """y = map(lambda row: tanh(row @ w) * (i + 1), x): scan output rows [N, T], and the
        sum of the rows carried (a second carried value)."""
        from onnx import TensorProto, helper
        np = _np()
        nodes, n_outer = self._n()
        nodes += [_const("max_trip", INT64_MAX, "int64"), _const("i_0", 0, "int64"),
                  helper.make_node("Less", ["i_0", n_outer or "n_max"], ["cond_0"]),
                  helper.make_node("Mul", ["x", "zero_row"], ["acc_full"]),
                  _const("rows_axis", [0], "int64")]
        nodes += [helper.make_node("ReduceSum", ["acc_full", "rows_axis"], ["acc_0"], keepdims=0)
                  if self.opset >= 13 else
                  helper.make_node("ReduceSum", ["acc_full"], ["acc_0"], axes=[0], keepdims=0)]
        if not n_outer:  # the body's constant bounds the loop; the first condition is true
            nodes.insert(0, _const("n_max", MAP_X[0], "int64"))
        body = self._body(n_outer)
        nodes.append(helper.make_node("Loop", ["max_trip", "cond_0", "i_0", "acc_0"],
                                      ["i_final", "acc_final", "rows"], body=body, name="while"))
        nodes.append(helper.make_node("Add", ["rows", "acc_final"], ["y"]))
        inits = [_w("w", MAP_X[1], MAP_X[1]),
                 __import__("onnx").numpy_helper.from_array(np.zeros((1, MAP_X[1]), np.float32), "zero_row")]
        graph = helper.make_graph(
            nodes, "tf2onnx",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "T"]),
             helper.make_tensor_value_info("n", TensorProto.INT64, [])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M", "T"])], initializer=inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)],
                                  producer_name="tf2onnx")
        model.ir_version = 8
        return model

    def _n(self) -> tuple[list, str]:
        """(nodes, the outer name of n) — empty when the body holds n as its own constant."""
        from onnx import TensorProto, helper
        if self.n == "shape":    # tf.shape(x)[0], as tf2onnx writes a strided slice of a shape
            return [helper.make_node("Shape", ["x"], ["xs"]), _const("s0", [0], "int64"),
                    _const("s1", [1], "int64"), helper.make_node("Slice", ["xs", "s0", "s1"], ["n1"]),
                    _const("n_axes", [0], "int64"),
                    helper.make_node("Squeeze", ["n1", "n_axes"], ["n_len"]) if self.opset >= 13
                    else helper.make_node("Squeeze", ["n1"], ["n_len"], axes=[0])], "n_len"
        if self.n == "bound":
            return [helper.make_node("Identity", ["n"], ["n_len"])], "n_len"
        if self.n == "data":     # how many rows have a positive sum: known only at run time
            return [_const("d_axes", [1], "int64"),
                    helper.make_node("ReduceSum", ["x", "d_axes"], ["d_sum"], keepdims=0)
                    if self.opset >= 13 else
                    helper.make_node("ReduceSum", ["x"], ["d_sum"], axes=[1], keepdims=0),
                    _const("d_zero", 0.0, "float32"),
                    helper.make_node("Greater", ["d_sum", "d_zero"], ["d_pos"]),
                    helper.make_node("Cast", ["d_pos"], ["d_int"], to=TensorProto.INT64),
                    helper.make_node("ReduceSum", ["d_int"], ["d_len"], keepdims=0),
                    _const("d_one", 1, "int64"),
                    helper.make_node("Max", ["d_len", "d_one"], ["n_len"])], "n_len"
        assert self.n == "body", self.n
        return [], ""

    def _body(self, n_outer: str):
        from onnx import TensorProto, helper, numpy_helper
        np = _np()
        limit = n_outer or "n_body"
        counter = "i_in" if self.counter == "carried" else "iter"
        nodes = [helper.make_node("Gather", ["x", counter], ["row"], axis=0),
                 _const("row_axes", [0], "int64"),
                 helper.make_node("Unsqueeze", ["row", "row_axes"], ["row2"]) if self.opset >= 13
                 else helper.make_node("Unsqueeze", ["row"], ["row2"], axes=[0]),
                 helper.make_node("MatMul", ["row2", "w"], ["rw"]),
                 helper.make_node("Tanh", ["rw"], ["t"]),
                 helper.make_node("Cast", [counter], ["cf"], to=TensorProto.FLOAT),
                 _const("onef", 1.0, "float32"), helper.make_node("Add", ["cf", "onef"], ["k"]),
                 helper.make_node("Mul", ["t", "k"], ["mapped2"]),
                 helper.make_node("Squeeze", ["mapped2", "row_axes"], ["mapped"]) if self.opset >= 13
                 else helper.make_node("Squeeze", ["mapped2"], ["mapped"], axes=[0]),
                 helper.make_node("Add", ["acc_in", "mapped"], ["acc_out"]),
                 _const("one", 1, "int64"), helper.make_node("Add", ["i_in", "one"], ["i_out"]),
                 helper.make_node("Add", ["iter", "one"], ["iter_next"])]
        nxt = "i_out" if self.counter == "carried" else "iter_next"
        if self.cond == "and":  # while_v2: loop_counter < maximum_iterations and i < n
            nodes += [helper.make_node("Less", ["iter_next", limit], ["below_max"]),
                      helper.make_node("Less", [nxt, limit], ["below_n"]),
                      helper.make_node("And", ["below_max", "below_n"], ["cond_out"])]
        else:
            nodes.append(helper.make_node("Less", [nxt, limit], ["cond_out"]))
        inits = [] if n_outer else [numpy_helper.from_array(np.array(MAP_X[0], np.int64), "n_body")]
        return helper.make_graph(
            nodes, "while_body",
            [helper.make_tensor_value_info("iter", TensorProto.INT64, []),
             helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
             helper.make_tensor_value_info("i_in", TensorProto.INT64, []),
             helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, ["T"])],
            [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
             helper.make_tensor_value_info("i_out", TensorProto.INT64, []),
             helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, ["T"]),
             helper.make_tensor_value_info("mapped", TensorProto.FLOAT, ["T"])], initializer=inits)

    def inputs(self) -> list[dict]:
        return [{"name": "x", "shape": list(MAP_X), "dtype": "float32"},
                {"name": "n", "shape": [], "dtype": "int64"}]

    def constants(self) -> list[dict]:
        return [{"name": "n", "value": MAP_X[0]}]

    def feeds(self) -> dict:
        np = _np()
        return {"x": (_rng().standard_normal(MAP_X) * 0.5).astype(np.float32),
                "n": np.array(MAP_X[0], np.int64)}


def map_fn_cases() -> list[MapFnCase]:
    cases = [MapFnCase(n, "carried", "less", 13) for n in ("shape", "bound", "body")]
    cases += [MapFnCase("shape", "iteration", "less", 11), MapFnCase("shape", "carried", "and", 18),
              MapFnCase("body", "iteration", "and", 18)]
    return cases


# ----------------------------------------------------------------------------- transformer encoder
ENC = {"vocab": 30, "embed": 8, "hidden": 16, "heads": 2, "positions": 12}
ENC_INPUT = (1, 6)   # ids, mask [B, S] bound to this


@dataclass(frozen=True)
class EncoderCase:
    heads: str = "chain"   # chain (Shape->Gather->Unsqueeze->Concat) | slice (Shape[start:end]) |
    #                        unbind (TorchScript: one QKV MatMul unbound by SplitToSequence +
    #                        SequenceAt, heads merged by SplitToSequence + ConcatFromSequence)
    mask: str = "int64"    # int64 | bool (Where on the mask)
    layers: int = 2        # ALBERT: every layer the same weights
    opset: int = 18

    @property
    def name(self) -> str:
        return f"encoder-{self.heads}-{self.mask}-x{self.layers}-op{self.opset}"

    def model(self):
        from onnx import TensorProto, helper
        d = ENC["hidden"]
        inits = [_w("emb", ENC["vocab"], ENC["embed"]), _w("emb_proj", ENC["embed"], d),
                 _w("pos", ENC["positions"], d), _w("ln_g", d, scale=0.1, offset=1.0),
                 _w("ln_b", d, scale=0.1), _w("wqkv", d, 3 * d), _w("bqkv", 3 * d, scale=0.1),
                 _w("wo", d, d), _w("bo", d, scale=0.1)]
        for k in range(3):
            inits += [_w(f"w{'qkv'[k]}", d, d), _w(f"b{'qkv'[k]}", d, scale=0.1)]
        nodes = [helper.make_node("Gather", ["emb", "ids"], ["e0"]),
                 helper.make_node("MatMul", ["e0", "emb_proj"], ["e"])]
        nodes += self._dims()
        # position ids: Range(0, S) Unsqueezed and Expanded to [B, S]
        nodes += [_const("zero", 0, "int64"), _const("one", 1, "int64"),
                  helper.make_node("Range", ["zero", "S", "one"], ["pid"]),
                  self._unsqueeze("pid", "pid2", [0]),
                  helper.make_node("Concat", ["Bu", "Su"], ["bs"], axis=0),
                  helper.make_node("Expand", ["pid2", "bs"], ["pids"]),
                  helper.make_node("Gather", ["pos", "pids"], ["pe"]),
                  helper.make_node("Add", ["e", "pe"], ["x0"])]
        nodes += self._layer_norm("x0", "L0")
        nodes += self._mask()
        for layer in range(self.layers):
            nodes += self._attention(f"L{layer}", f"L{layer + 1}", f"l{layer}_")
        last = f"L{self.layers}"
        if self.opset >= 18:   # axes an input from opset 18
            nodes += [_const("seq_axis", [1], "int64"),
                      helper.make_node("ReduceMean", [last, "seq_axis"], ["pooled"], keepdims=0)]
        else:
            nodes.append(helper.make_node("ReduceMean", [last], ["pooled"], axes=[1], keepdims=0))
        graph = helper.make_graph(
            nodes, "encoder",
            [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"]),
             helper.make_tensor_value_info("mask", TensorProto.BOOL if self.mask == "bool"
                                           else TensorProto.INT64, ["batch", "seq"])],
            [helper.make_tensor_value_info(f"L{self.layers}", TensorProto.FLOAT, ["batch", "seq", d]),
             helper.make_tensor_value_info("pooled", TensorProto.FLOAT, ["batch", d])],
            initializer=inits)
        read = {i for n in nodes for i in n.input}
        graph.initializer.sort(key=lambda t: t.name)
        keep = [t for t in graph.initializer if t.name in read]
        del graph.initializer[:]
        graph.initializer.extend(keep)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)],
                                  producer_name="pytorch")
        model.ir_version = 8
        return model

    def _unsqueeze(self, x: str, out: str, axes: list):
        from onnx import helper
        if self.opset >= 13:
            return helper.make_node("Unsqueeze", [x, f"{out}__axes"], [out])
        return helper.make_node("Unsqueeze", [x], [out], axes=axes)

    def _dims(self) -> list:
        """B, S as scalars and Bu, Su as [1] from the ids' shape, as the exporter writes them."""
        from onnx import helper
        axes = [_const(f"{v}__axes", [0], "int64") for v in ("Bu", "Su", "pid2")] if self.opset >= 13 else []
        if self.heads == "slice" and self.opset >= 15:
            return axes[2:] + [helper.make_node("Shape", ["ids"], ["Bu"], start=0, end=1),
                               helper.make_node("Shape", ["ids"], ["Su"], start=1, end=2),
                               helper.make_node("Squeeze", ["Su", "pid2__axes"], ["S"])]
        return axes + [helper.make_node("Shape", ["ids"], ["s"]), _const("i0", 0, "int64"),
                       _const("i1", 1, "int64"), helper.make_node("Gather", ["s", "i0"], ["B"]),
                       helper.make_node("Gather", ["s", "i1"], ["S"]),
                       self._unsqueeze("B", "Bu", [0]), self._unsqueeze("S", "Su", [0])]

    def _layer_norm(self, x: str, out: str, p: str = "") -> list:
        from onnx import helper
        if self.opset >= 17:
            return [helper.make_node("LayerNormalization", [x, "ln_g", "ln_b"], [out], axis=-1,
                                     epsilon=1e-5)]
        p = f"{p}{out}_"   # as torch exports it before opset 17
        mean = (lambda i, o: helper.make_node("ReduceMean", [i], [o], axes=[-1], keepdims=1))
        return [mean(x, p + "mu"), helper.make_node("Sub", [x, p + "mu"], [p + "c"]),
                _const(p + "two", 2.0, "float32"), helper.make_node("Pow", [p + "c", p + "two"], [p + "c2"]),
                mean(p + "c2", p + "var"), _const(p + "eps", 1e-5, "float32"),
                helper.make_node("Add", [p + "var", p + "eps"], [p + "ve"]),
                helper.make_node("Sqrt", [p + "ve"], [p + "sd"]),
                helper.make_node("Div", [p + "c", p + "sd"], [p + "n"]),
                helper.make_node("Mul", [p + "n", "ln_g"], [p + "g"]),
                helper.make_node("Add", [p + "g", "ln_b"], [out])]

    def _mask(self) -> list:
        """mask [B, S] -> additive [B, 1, 1, S] (min where masked) Expanded to [B, H, S, S]."""
        from onnx import TensorProto, helper
        nodes = [_const("m_axes", [1, 2], "int64")]
        nodes += [helper.make_node("Unsqueeze", ["mask", "m_axes"], ["m4"]) if self.opset >= 13
                  else helper.make_node("Unsqueeze", ["mask"], ["m4"], axes=[1, 2])]
        if self.mask == "bool":
            nodes += [_const("keep", 0.0, "float32"), _const("drop", -3.4e38, "float32"),
                      helper.make_node("Where", ["m4", "keep", "drop"], ["madd"])]
        else:
            nodes += [helper.make_node("Cast", ["m4"], ["mf"], to=TensorProto.FLOAT),
                      _const("onef", 1.0, "float32"), helper.make_node("Sub", ["onef", "mf"], ["inv"]),
                      _const("neg", -1e4, "float32"), helper.make_node("Mul", ["inv", "neg"], ["madd"])]
        return nodes + [_const("Hc", [ENC["heads"]], "int64"),
                        helper.make_node("Concat", ["Bu", "Hc", "Su", "Su"], ["bhss"], axis=0),
                        helper.make_node("Expand", ["madd", "bhss"], ["mfull"]),
                        _const("hd", [ENC["heads"], ENC["hidden"] // ENC["heads"]], "int64"),
                        helper.make_node("Concat", ["Bu", "Su", "hd"], ["heads_shape"], axis=0),
                        _const("Dc", [ENC["hidden"]], "int64"),
                        helper.make_node("Concat", ["Bu", "Su", "Dc"], ["merged_shape"], axis=0)]

    def _attention(self, x: str, out: str, p: str) -> list:
        from onnx import TensorProto, helper
        d, h = ENC["hidden"], ENC["heads"]
        nodes = []
        if self.heads == "unbind":   # one MatMul, [B, S, 3, H, Dh], unbound along 2
            nodes += [helper.make_node("MatMul", [x, "wqkv"], [p + "qkv0"]),
                      helper.make_node("Add", [p + "qkv0", "bqkv"], [p + "qkv1"]),
                      _const(p + "three", [3, h, d // h], "int64"),
                      helper.make_node("Concat", ["Bu", "Su", p + "three"], [p + "qkv_shape"], axis=0),
                      helper.make_node("Reshape", [p + "qkv1", p + "qkv_shape"], [p + "qkv"]),
                      helper.make_node("SplitToSequence", [p + "qkv"], [p + "qkv_seq"], axis=2, keepdims=0)]
            for k, name in enumerate("qkv"):
                nodes += [_const(p + f"at{k}", k, "int64"),
                          helper.make_node("SequenceAt", [p + "qkv_seq", p + f"at{k}"], [p + f"r{name}"])]
        else:
            for name in "qkv":
                nodes += [helper.make_node("MatMul", [x, f"w{name}"], [p + f"m{name}"]),
                          helper.make_node("Add", [p + f"m{name}", f"b{name}"], [p + f"a{name}"]),
                          helper.make_node("Reshape", [p + f"a{name}", "heads_shape"], [p + f"r{name}"])]
        for name in "qkv":
            nodes.append(helper.make_node("Transpose", [p + f"r{name}"], [p + f"t{name}"],
                                          perm=[0, 2, 3, 1] if name == "k" else [0, 2, 1, 3]))
        nodes += [helper.make_node("MatMul", [p + "tq", p + "tk"], [p + "sc0"]),
                  helper.make_node("Shape", [p + "tq"], [p + "qs"]), _const(p + "last", [-1], "int64"),
                  _const(p + "end", [2 ** 62], "int64"),
                  helper.make_node("Slice", [p + "qs", p + "last", p + "end"], [p + "dh"]),
                  helper.make_node("Cast", [p + "dh"], [p + "dhf"], to=TensorProto.FLOAT),
                  helper.make_node("Sqrt", [p + "dhf"], [p + "sq"]),
                  helper.make_node("Div", [p + "sc0", p + "sq"], [p + "sc1"]),
                  helper.make_node("Add", [p + "sc1", "mfull"], [p + "sc"]),
                  helper.make_node("Softmax", [p + "sc"], [p + "pr"], axis=-1),
                  helper.make_node("MatMul", [p + "pr", p + "tv"], [p + "ctx"])]
        if self.heads == "unbind":   # torch.cat(ctx.unbind(1), -1): heads merged by a sequence
            nodes += [helper.make_node("SplitToSequence", [p + "ctx"], [p + "ctx_seq"], axis=1, keepdims=0),
                      helper.make_node("ConcatFromSequence", [p + "ctx_seq"], [p + "y0"], axis=-1)]
        else:
            nodes += [helper.make_node("Transpose", [p + "ctx"], [p + "ct"], perm=[0, 2, 1, 3]),
                      helper.make_node("Reshape", [p + "ct", "merged_shape"], [p + "y0"])]
        nodes += [helper.make_node("MatMul", [p + "y0", "wo"], [p + "o0"]),
                  helper.make_node("Add", [p + "o0", "bo"], [p + "o1"]),
                  helper.make_node("Add", [p + "o1", x], [p + "res"])]
        nodes += self._layer_norm(p + "res", p + "ln", p)
        return nodes + [  # GELU with Erf, as torch exports it
            _const(p + "rt", float(_np().sqrt(0.5)), "float32"),
            helper.make_node("Mul", [p + "ln", p + "rt"], [p + "gh"]),
            helper.make_node("Erf", [p + "gh"], [p + "er"]), _const(p + "onef", 1.0, "float32"),
            helper.make_node("Add", [p + "er", p + "onef"], [p + "e1"]),
            _const(p + "half", 0.5, "float32"), helper.make_node("Mul", [p + "ln", p + "half"], [p + "lh"]),
            helper.make_node("Mul", [p + "lh", p + "e1"], [out])]

    def inputs(self) -> list[dict]:
        return [{"name": "ids", "shape": list(ENC_INPUT), "dtype": "int64"},
                {"name": "mask", "shape": list(ENC_INPUT),
                 "dtype": "bool" if self.mask == "bool" else "int64"}]

    def constants(self) -> list[dict]:
        return []

    def feeds(self) -> dict:
        np = _np()
        mask = np.ones(ENC_INPUT, np.int64)
        mask[:, -2:] = 0   # padding at the end
        return {"ids": _rng().integers(0, ENC["vocab"], ENC_INPUT).astype(np.int64),
                "mask": mask.astype(bool) if self.mask == "bool" else mask}


def encoder_cases() -> list[EncoderCase]:
    return [EncoderCase("chain", "int64", 2, 13), EncoderCase("chain", "bool", 2, 17),
            EncoderCase("slice", "int64", 3, 18), EncoderCase("unbind", "int64", 2, 13),
            EncoderCase("unbind", "bool", 1, 18)]
