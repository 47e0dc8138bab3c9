"""Generated onnxruntime-quantized graphs: the com.microsoft ops `decompose-contrib-ops` takes.

A case varies what onnxruntime's quantizer and real exports vary: int8 or uint8 weights, with or
without zero points, scales per tensor or per output column, a bias or none, the batch dims and
K; for DynamicQuantizeLSTM also the direction, the batch, initial states (graph inputs of a
streaming model, constants, or none), `sequence_lens` (a graph input or a constant), whether Y
is an output (onnxruntime then reads the next state from Y, zero where a sequence has ended),
where X comes from (a graph input, or an embedding Gather + Transpose as in text models), two
LSTMs stacked (the second's input shape is known only once the first is standard ONNX), and the
opset (13, or 17/18).

The reference is onnxruntime where it computes the integer arithmetic exactly: on the model
itself with uint8 weights; with int8 weights on `uint8_twin(model)` (the same weights + 128,
zero point + 128: the same integers), because onnxruntime's x86 AVX2 u8 x s8 kernel (no VNNI)
saturates pairs of products at int16 and is not exact there.
"""
from __future__ import annotations

from dataclasses import dataclass

MS = "com.microsoft"


def _rng(seed: int):
    import numpy as np
    return np.random.default_rng(seed)


def quantized(w, signed: bool, axis_columns: bool, common_zero: bool = False):
    """w [..., K, N] as onnxruntime's quantizer stores it: int8 symmetric (zero point 0) or
    uint8 asymmetric, scales per tensor (over the last two dims) or per column N; with
    `common_zero` one uint8 zero point for all (DynamicQuantizeLSTM requires that of per-column
    zero points, over both directions)."""
    import numpy as np
    keep = (w.ndim - 1,) if axis_columns else ()
    reduce = tuple(a for a in range(w.ndim) if a not in keep and a >= w.ndim - 2)
    if signed:
        scale = np.abs(w).max(axis=reduce, keepdims=True) / 127
        return (np.round(w / scale).clip(-127, 127).astype(np.int8), scale.astype(np.float32),
                np.zeros(scale.shape, np.int8))
    low = np.minimum(w.min(axis=reduce, keepdims=True), 0)
    high = np.maximum(w.max(axis=reduce, keepdims=True), 0)
    scale = (high - low) / 255
    zero = np.round(-low / scale).clip(0, 255)
    if common_zero:
        zero = np.full(zero.shape, np.median(zero))
    return (np.round(w / scale + zero).clip(0, 255).astype(np.uint8), scale.astype(np.float32),
            zero.astype(np.uint8))


# ----------------------------------------------------------------------------- DynamicQuantizeMatMul
@dataclass(frozen=True)
class MatMul:
    seed: int = 0
    lead: tuple = (3,)          # the dims of A before K
    k: int = 24
    n: int = 8
    signed: bool = True
    per_column: bool = False
    zero_point: bool = True     # an explicit b_zero_point input (int8: zeros)
    bias: bool = True
    opset: int = 17

    @property
    def name(self) -> str:
        return (f"{'s8' if self.signed else 'u8'}-{'col' if self.per_column else 'tensor'}"
                f"{'-zp' if self.zero_point else ''}{'-bias' if self.bias else ''}"
                f"-A{'x'.join(map(str, self.lead))}x{self.k}-N{self.n}-op{self.opset}")

    def build(self) -> tuple:
        """(the model, its feeds)."""
        return self._model(), self._feeds()

    def _model(self):
        import numpy as np
        from onnx import TensorProto as T, helper as h, numpy_helper as nh
        rng = _rng(self.seed)
        w = rng.standard_normal((self.k, self.n)).astype(np.float32) * 0.5
        q, scale, zero = quantized(w, self.signed, self.per_column)
        scale, zero = (scale.reshape(-1), zero.reshape(-1)) if self.per_column else \
            (scale.reshape(()), zero.reshape(()))
        if not self.signed and not self.zero_point:
            q = np.round(w / scale).clip(0, 255).astype(np.uint8)   # no zero point: 0
        inits = [nh.from_array(q, "bq"), nh.from_array(scale, "bs")]
        ins = ["a", "bq", "bs", "", ""]
        if self.zero_point:
            inits.append(nh.from_array(zero, "bz"))
            ins[3] = "bz"
        if self.bias:
            inits.append(nh.from_array(rng.standard_normal(self.n).astype(np.float32), "bias"))
            ins[4] = "bias"
        while not ins[-1]:
            ins.pop()
        node = h.make_node("DynamicQuantizeMatMul", ins, ["y"], domain=MS, name="dqmm")
        graph = h.make_graph([node], "g", [h.make_tensor_value_info("a", T.FLOAT, [*self.lead, self.k])],
                             [h.make_tensor_value_info("y", T.FLOAT, [*self.lead, self.n])], inits)
        return h.make_model(graph, opset_imports=[h.make_opsetid("", self.opset),
                                                  h.make_opsetid(MS, 1)])

    def _feeds(self) -> dict:
        import numpy as np
        rng = _rng(self.seed + 1000)
        a = rng.standard_normal((*self.lead, self.k)) * 2 + rng.standard_normal()  # off-centre
        return {"a": a.astype(np.float32)}


def matmul_cases() -> list[MatMul]:
    """Weight kinds x scale granularity x zero point x bias, over batch dims, K and opsets; one
    K long enough that float32 sums would not be exact in one piece (chunked)."""
    cases = []
    for i, (signed, per_column, zero_point, bias) in enumerate(
            (s, c, z, b) for s in (True, False) for c in (False, True)
            for z in (True, False) for b in (True, False)):
        lead = ((1,), (4,), (2, 3))[i % 3]
        cases.append(MatMul(seed=i, lead=lead, k=(24, 130, 257)[i % 3], n=(8, 17)[i % 2],
                            signed=signed, per_column=per_column, zero_point=zero_point,
                            bias=bias, opset=(13, 17, 18)[i % 3]))
    cases.append(MatMul(seed=99, lead=(2,), k=2500, n=6, signed=False, per_column=True))
    return cases


# ----------------------------------------------------------------------------- DynamicQuantizeLSTM
@dataclass(frozen=True)
class Lstm:
    seed: int = 0
    direction: str = "forward"
    seq: int = 5
    batch: int = 1
    size: int = 6
    hidden: int = 8
    signed: bool = True
    per_column: bool = False
    bias: bool = True
    state: str = "input"        # input | constant | none
    lens: str = "none"          # none | input | constant
    y: bool = True              # Y among the node's outputs
    source: str = "input"       # input (X a graph input) | embedding (Gather of ids, Transpose)
    stacked: bool = False       # a second LSTM on the first one's Y (Transpose + Reshape)
    computed: bool = False      # ... the Reshape's shape computed from Shape(Y) as PyTorch's
    #                             dynamo exporter writes it (Slice, Mul, Reshape, Concat: onnx's
    #                             data propagation stops at the Reshape)
    opset: int = 17

    @property
    def dirs(self) -> int:
        return 2 if self.direction == "bidirectional" else 1

    @property
    def name(self) -> str:
        return (f"{self.direction}-b{self.batch}-{'s8' if self.signed else 'u8'}"
                f"-{'col' if self.per_column else 'dir'}{'-bias' if self.bias else ''}"
                f"-state_{self.state}-lens_{self.lens}{'' if self.y else '-noY'}-x_{self.source}"
                f"{'-stacked' if self.stacked else ''}{'-computed' if self.computed else ''}"
                f"-op{self.opset}")

    def lengths(self):
        import numpy as np
        lens = _rng(self.seed + 7).integers(1, self.seq + 1, self.batch).astype(np.int32)
        lens[0] = self.seq - 1 if self.seq > 1 else 1     # the longest shorter than seq
        return lens

    def build(self) -> tuple:
        """(the model, its feeds: X or the ids, and the states and lens it takes as inputs)."""
        from onnx import TensorProto as T, helper as h
        nodes, inits, inputs, feeds = [], [], [], {}
        x = self._source(nodes, inits, inputs, feeds)
        y, size, layers = x, self.size, 2 if self.stacked else 1
        for layer in range(layers):
            y = self._layer(layer, y, size, (nodes, inits, inputs, feeds), last=layer == layers - 1)
            size = self.dirs * self.hidden
        state = [self.dirs, self.batch, self.hidden]
        outputs = [h.make_tensor_value_info(n, T.FLOAT, [self.seq, *state] if n.endswith("_Y") else state)
                   for n in y]
        graph = h.make_graph(nodes, "g", inputs, outputs, inits)
        model = h.make_model(graph, opset_imports=[h.make_opsetid("", self.opset), h.make_opsetid(MS, 1)])
        return model, feeds

    def _source(self, nodes, inits, inputs, feeds) -> str:
        import numpy as np
        from onnx import TensorProto as T, helper as h, numpy_helper as nh
        rng = _rng(self.seed + 2000)
        if self.source == "input":
            inputs.append(h.make_tensor_value_info("x", T.FLOAT, [self.seq, self.batch, self.size]))
            feeds["x"] = (rng.standard_normal((self.seq, self.batch, self.size)) * 1.5).astype(np.float32)
            return "x"
        inputs.append(h.make_tensor_value_info("ids", T.INT64, [self.batch, self.seq]))
        feeds["ids"] = rng.integers(0, 20, (self.batch, self.seq)).astype(np.int64)
        table = _rng(self.seed + 3).standard_normal((20, self.size)).astype(np.float32)
        inits.append(nh.from_array(table, "table"))
        nodes += [h.make_node("Gather", ["table", "ids"], ["emb"], axis=0),
                  h.make_node("Transpose", ["emb"], ["x"], perm=[1, 0, 2])]
        return "x"

    def _layer(self, layer: int, x: str, size: int, graph: tuple, last: bool) -> list[str]:
        """One DynamicQuantizeLSTM reading x [seq, batch, size]; its outputs, or (not the last
        layer) the next layer's input, [seq, batch, dirs * hidden]."""
        import numpy as np
        from onnx import TensorProto as T, helper as h, numpy_helper as nh
        rng, p, hidden, dirs = _rng(self.seed * 10 + layer), f"l{layer}_", self.hidden, self.dirs
        nodes, inits, inputs, feeds = graph
        names = {}
        for what, k in (("W", size), ("R", hidden)):
            q, scale, zero = quantized(rng.standard_normal((dirs, k, 4 * hidden)).astype(np.float32)
                                       * 0.4, self.signed, self.per_column, common_zero=self.per_column)
            if self.per_column:
                scale = scale.reshape(dirs, 4 * hidden)
                zero = zero.reshape(dirs, 4 * hidden)
            else:
                scale, zero = scale.reshape(dirs), zero.reshape(dirs)
            inits += [nh.from_array(q, p + what), nh.from_array(scale, p + what + "_scale"),
                      nh.from_array(zero, p + what + "_zp")]
            names[what] = p + what
        ins = [x, names["W"], names["R"], "", "", "", "", "",
               p + "W_scale", p + "W_zp", p + "R_scale", p + "R_zp"]
        if self.bias:
            inits.append(nh.from_array((rng.standard_normal((dirs, 8 * hidden)) * 0.2)
                                       .astype(np.float32), p + "B"))
            ins[3] = p + "B"
        if self.lens != "none":
            ins[4] = self._value("lens", self.lengths(), T.INT32, graph, self.lens)
        if self.state != "none":
            for k, what in ((5, "h0"), (6, "c0")):
                ins[k] = self._value(p + what, (rng.standard_normal((dirs, self.batch, hidden)) * 0.5)
                                     .astype(np.float32), T.FLOAT, graph, self.state)
        outs = [p + "Y" if self.y or not last else "", p + "Y_h", p + "Y_c"]
        nodes.append(h.make_node("DynamicQuantizeLSTM", ins, outs, domain=MS, name=p + "lstm",
                                 hidden_size=hidden, direction=self.direction))
        if last:
            return [o for o in outs if o]
        nodes += [h.make_node("Transpose", [p + "Y"], [p + "Yt"], perm=[0, 2, 1, 3]),
                  h.make_node("Reshape", [p + "Yt", p + "shape"], [p + "next"])]
        if not self.computed:
            inits.append(nh.from_array(np.array([0, 0, -1], np.int64), p + "shape"))
            return p + "next"
        for k in range(5):
            inits.append(nh.from_array(np.array([k], np.int64), f"{p}at{k}"))
        inits.append(nh.from_array(np.array([1], np.int64), p + "one"))
        nodes[-1:-1] = [h.make_node("Shape", [p + "Yt"], [p + "dims"])] + [
            h.make_node("Slice", [p + "dims", f"{p}at{k}", f"{p}at{k + 1}"], [f"{p}d{k}"])
            for k in range(4)] + [
            h.make_node("Mul", [p + "d2", p + "d3"], [p + "d23"]),
            h.make_node("Reshape", [p + "d23", p + "one"], [p + "flat"]),
            h.make_node("Concat", [p + "d0", p + "d1", p + "flat"], [p + "shape"], axis=0)]
        return p + "next"

    @staticmethod
    def _value(name, array, elem, graph: tuple, where: str) -> str:
        """A graph input named `name` (its value fed) or a constant of that value; once."""
        from onnx import helper as h, numpy_helper as nh
        _, inits, inputs, feeds = graph
        if any(t.name == name for t in inits) or any(i.name == name for i in inputs):
            return name
        if where == "constant":
            inits.append(nh.from_array(array, name))
        else:
            inputs.append(h.make_tensor_value_info(name, elem, list(array.shape)))
            feeds[name] = array
        return name


def lstm_cases() -> list[Lstm]:
    """Directions x batch x weight kinds x states x sequence_lens x Y x X's source x stacking x
    opset: each feature varied against a few others (not the full product: seconds, not minutes)."""
    cases = []
    for i, direction in enumerate(("forward", "reverse", "bidirectional") * 6):
        cases.append(Lstm(seed=i, direction=direction, batch=(1, 3, 2)[i % 3 if i < 9 else (i + 1) % 3],
                          signed=i % 2 == 0, per_column=i % 4 in (1, 2), bias=i % 5 != 4,
                          state=("input", "none", "constant")[i % 3 if i < 9 else (i + 2) % 3],
                          lens=("none", "input", "constant")[(i // 3) % 3] if i % 3 else
                          ("none", "input")[(i // 3) % 2],
                          y=i % 6 != 5, source="embedding" if i % 7 == 3 else "input",
                          stacked=i in (4, 11), opset=(13, 17, 18)[i % 3]))
    return cases


# ----------------------------------------------------------------------------- references
def uint8_twin(model):
    """The same model with every int8 weight of a com.microsoft op as uint8 + 128 and its zero
    point + 128: the same integers (w - zp), which onnxruntime multiplies exactly on every CPU."""
    import numpy as np
    import onnx
    from onnx import numpy_helper as nh
    twin = onnx.ModelProto.FromString(model.SerializeToString())
    inits = {t.name: t for t in twin.graph.initializer}
    weights = {"DynamicQuantizeMatMul": ((1, 3),), "DynamicQuantizeLSTM": ((1, 9), (2, 11)),
               "MatMulInteger": ((1, 3),), "MatMulIntegerToFloat": ((1, 5),)}
    for node in twin.graph.node:
        for q, zp in weights.get(node.op_type, ()):
            if nh.to_array(inits[node.input[q]]).dtype != np.int8:
                continue
            for name in (node.input[q], node.input[zp] if len(node.input) > zp else ""):
                if name:
                    value = nh.to_array(inits[name]).astype(np.int16) + 128
                    inits[name].CopyFrom(nh.from_array(value.astype(np.uint8), name))
            if len(node.input) <= zp or not node.input[zp]:   # no zero point: 0, now 128
                name = f"{node.input[q]}__zp128"
                twin.graph.initializer.append(nh.from_array(np.array(128, np.uint8), name))
                node.input.extend([""] * (zp + 1 - len(node.input)))
                node.input[zp] = name
    return twin


def matmul_integer_to_float(seed: int = 0, per_column: bool = True):
    """(model, feeds): onnxruntime's fused MatMulIntegerToFloat on a uint8 input (the form its
    optimizer saves when A was quantized in the graph), int8 weights, a zero point for A."""
    import numpy as np
    from onnx import TensorProto as T, helper as h, numpy_helper as nh
    rng = _rng(seed)
    q, scale, zero = quantized(rng.standard_normal((20, 7)).astype(np.float32), True, per_column)
    inits = [nh.from_array(q, "bq"), nh.from_array(np.array([0.02], np.float32), "as"),
             nh.from_array(scale.reshape(-1) if per_column else scale.reshape(()), "bs"),
             nh.from_array(np.array([131], np.uint8), "az"),
             nh.from_array(rng.standard_normal(7).astype(np.float32), "bias")]
    node = h.make_node("MatMulIntegerToFloat", ["a", "bq", "as", "bs", "az", "", "bias"], ["y"],
                       domain=MS, name="mmitf")
    graph = h.make_graph([node], "g", [h.make_tensor_value_info("a", T.UINT8, [3, 20])],
                         [h.make_tensor_value_info("y", T.FLOAT, [3, 7])], inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17), h.make_opsetid(MS, 1)])
    return model, {"a": rng.integers(0, 256, (3, 20)).astype(np.uint8)}


def matmul_reference(model, feeds: dict):
    """DynamicQuantizeMatMul's integer arithmetic in numpy (int64), from the model's own weights:
    what onnxruntime computes where it is exact."""
    import numpy as np
    from onnx import numpy_helper as nh
    (node,) = model.graph.node
    inits = {t.name: nh.to_array(t) for t in model.graph.initializer}
    ins = list(node.input) + [""] * (5 - len(node.input))
    a = feeds[ins[0]]
    low, high = min(a.min(), np.float32(0)), max(a.max(), np.float32(0))
    scale = np.float32(1) if high == low else np.float32((high - low) / np.float32(255))
    zp = np.round(np.clip(np.float32(0) - low / scale, 0, 255))
    centred = np.clip(np.round(a / scale), -zp, 255 - zp).astype(np.int64)
    w = inits[ins[1]].astype(np.int64) - (inits[ins[3]].astype(np.int64) if ins[3] else 0)
    y = (centred @ w).astype(np.float32) * (scale * inits[ins[2]].astype(np.float32))
    return y + inits[ins[4]] if ins[4] else y


def ort_run(model, feeds: dict) -> list:
    """onnxruntime CPU, one thread (as golden runs it: onnxruntime's LSTM quantizes the state of
    each thread's share of the batch on its own)."""
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    return session.run(None, {k: v for k, v in feeds.items() if k in names})


def float_model(kind: str, opset: int, seed: int = 0):
    """A float model for onnxruntime's quantize_dynamic: `lstm` (bidirectional, X a graph
    input, Y and the states as outputs) or `matmul` (MatMul + Add, as PyTorch's Linear)."""
    import numpy as np
    from onnx import TensorProto as T, helper as h, numpy_helper as nh
    rng = _rng(seed)
    if kind == "matmul":
        inits = [nh.from_array((rng.standard_normal((32, 16)) * 0.3).astype(np.float32), "w"),
                 nh.from_array(rng.standard_normal(16).astype(np.float32), "b")]
        nodes = [h.make_node("MatMul", ["x", "w"], ["xw"]), h.make_node("Add", ["xw", "b"], ["y"])]
        ins = [h.make_tensor_value_info("x", T.FLOAT, [4, 32])]
        outs = [h.make_tensor_value_info("y", T.FLOAT, [4, 16])]
    else:
        hidden, size = 16, 12
        inits = [nh.from_array((rng.standard_normal((2, 4 * hidden, size)) * 0.3).astype(np.float32), "W"),
                 nh.from_array((rng.standard_normal((2, 4 * hidden, hidden)) * 0.3).astype(np.float32), "R"),
                 nh.from_array((rng.standard_normal((2, 8 * hidden)) * 0.1).astype(np.float32), "B")]
        nodes = [h.make_node("LSTM", ["x", "W", "R", "B"], ["y", "yh", "yc"], hidden_size=hidden,
                             direction="bidirectional")]
        ins = [h.make_tensor_value_info("x", T.FLOAT, [6, 1, size])]
        outs = [h.make_tensor_value_info(n, T.FLOAT, [6, 2, 1, hidden] if n == "y" else [2, 1, hidden])
                for n in ("y", "yh", "yc")]
    return h.make_model(h.make_graph(nodes, "g", ins, outs, inits),
                        opset_imports=[h.make_opsetid("", opset)])
