"""Generated LSTM/GRU and Einsum graphs: the forms real exporters emit, one small model per case.

A recurrent case varies what exporters vary (PyTorch, tf2onnx, Keras, onnxruntime's quantizer):
the op and its direction, `layout` (batch first), the batch, where the state comes from (graph
inputs `initial_h`/`initial_c` of a streaming model, absent, or zeros built from the input's
shape as PyTorch exports them), which of Y / Y_h / Y_c are graph outputs, `sequence_lens`,
GRU's `linear_before_reset`, `clip`, non-default activations with their alpha/beta, peepholes,
`input_forget`, the weights as initializers or computed from constants, and the opset (13, the
last without `layout`, or 17/18).

onnxruntime is the reference (golden), except for what it does not run: `layout=1` ("Batchwise
recurrent operations (layout == 1) are not supported", onnxruntime 1.32). `reference()` is then
the same computation in the layout onnxruntime takes, with Transposes around the op: the batch-
first form, by the spec, is exactly that.

An Einsum case is an equation with its operand shapes, each operand a graph input or a weight.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

GATES = {"LSTM": 4, "GRU": 3}
OUTPUTS = {"LSTM": ("Y", "Y_h", "Y_c"), "GRU": ("Y", "Y_h")}


@dataclass(frozen=True)
class Rnn:
    op: str = "LSTM"
    direction: str = "forward"
    layout: int = 0
    batch: int = 1
    seq: int = 4
    size: int = 3
    hidden: int = 5
    state: str = "input"        # input (graph inputs: a streaming model) | none | zeros (from Shape)
    outputs: tuple = ("Y", "Y_h", "Y_c")
    lens: bool = False
    linear_before_reset: int = 0
    clip: float | None = None
    activations: tuple = ()     # per direction: LSTM (f, g, h), GRU (f, g)
    alpha: tuple = ()
    beta: tuple = ()
    peepholes: bool = False
    input_forget: int = 0
    weights: str = "initializer"  # initializer | computed (Unsqueeze of a constant, as PyTorch)
    opset: int = 17

    @property
    def dirs(self) -> int:
        return 2 if self.direction == "bidirectional" else 1

    @property
    def name(self) -> str:
        parts = [self.op, self.direction, f"layout{self.layout}", f"b{self.batch}",
                 f"state-{self.state}", "+".join(self.outputs), f"op{self.opset}"]
        if self.lens:
            parts.append("lens")
        if self.op == "GRU" and self.linear_before_reset:
            parts.append("lbr")
        if self.clip is not None:
            parts.append(f"clip{self.clip}")
        if self.activations:
            parts.append("act-" + "-".join(self.activations[:3 if self.op == "LSTM" else 2]))
        if self.peepholes:
            parts.append("peep")
        if self.input_forget:
            parts.append("input_forget")
        if self.weights != "initializer":
            parts.append(f"w-{self.weights}")
        return "_".join(parts)

    # ------------------------------------------------------------------ shapes
    def x_shape(self) -> list:
        return [self.batch, self.seq, self.size] if self.layout else [self.seq, self.batch, self.size]

    def state_shape(self) -> list:
        return ([self.batch, self.dirs, self.hidden] if self.layout
                else [self.dirs, self.batch, self.hidden])

    def y_shape(self) -> list:
        return ([self.batch, self.seq, self.dirs, self.hidden] if self.layout
                else [self.seq, self.dirs, self.batch, self.hidden])

    # ------------------------------------------------------------------ the model
    def model(self, rng_seed: int = 0):
        """The ONNX model of this case (weights drawn from `rng_seed`), shapes inferred."""
        return self._build(self.layout, rng_seed)

    def reference(self, rng_seed: int = 0):
        """What onnxruntime runs for this case: the model itself, or for layout=1 the same op in
        layout 0 with Transposes around it (the spec's definition of the batch-first form)."""
        return self._build(0, rng_seed, batch_first_io=bool(self.layout))

    def _build(self, layout: int, rng_seed: int, batch_first_io: bool = False):
        import numpy as np
        import onnx
        from onnx import TensorProto as T
        from onnx import helper as h
        from onnx import numpy_helper as nh

        rng = np.random.default_rng(rng_seed)
        g, H, d = GATES[self.op], self.hidden, self.dirs
        w = (rng.standard_normal((d, g * H, self.size)) * 0.5).astype(np.float32)
        r = (rng.standard_normal((d, g * H, H)) * 0.5).astype(np.float32)
        b = (rng.standard_normal((d, 2 * g * H)) * 0.3).astype(np.float32)
        p = (rng.standard_normal((d, 3 * H)) * 0.5).astype(np.float32)
        nodes, inits = [], []
        for key, value in (("W", w), ("R", r), ("B", b), ("P", p)):
            if key == "P" and not self.peepholes:
                continue
            if self.weights == "computed":  # exporters leave Unsqueeze(weight, 0) to be folded
                inits.append(nh.from_array(value[0] if d == 1 else value, f"{key}_raw"))
                if d == 1:
                    inits.append(nh.from_array(np.array([0], np.int64), f"{key}_axes"))
                    nodes.append(h.make_node("Unsqueeze", [f"{key}_raw", f"{key}_axes"], [key]))
                else:
                    nodes.append(h.make_node("Identity", [f"{key}_raw"], [key]))
            else:
                inits.append(nh.from_array(value, key))
        inputs = [h.make_tensor_value_info("X", T.FLOAT, self.x_shape())]
        x = "X"
        if batch_first_io and layout == 0:
            nodes.append(h.make_node("Transpose", ["X"], ["X_t"], perm=[1, 0, 2]))
            x = "X_t"
        init_h = init_c = ""
        if self.state == "input":
            inputs.append(h.make_tensor_value_info("initial_h", T.FLOAT, self.state_shape()))
            init_h = "initial_h"
            if self.op == "LSTM":
                inputs.append(h.make_tensor_value_info("initial_c", T.FLOAT, self.state_shape()))
                init_c = "initial_c"
            if batch_first_io and layout == 0:
                nodes.append(h.make_node("Transpose", ["initial_h"], ["h_t"], perm=[1, 0, 2]))
                init_h = "h_t"
                if init_c:
                    nodes.append(h.make_node("Transpose", ["initial_c"], ["c_t"], perm=[1, 0, 2]))
                    init_c = "c_t"
        elif self.state == "zeros":  # PyTorch: zeros of [dirs, batch, H], batch from Shape(X)
            batch_axis = 0 if layout else 1
            inits += [nh.from_array(np.array([batch_axis], np.int64), "batch_axis"),
                      nh.from_array(np.array([d], np.int64), "dirs"),
                      nh.from_array(np.array([H], np.int64), "hid")]
            parts = (["batch_dim", "dirs", "hid"] if layout else ["dirs", "batch_dim", "hid"])
            nodes += [h.make_node("Shape", [x], ["x_shape"]),
                      h.make_node("Gather", ["x_shape", "batch_axis"], ["batch_dim"], axis=0),
                      h.make_node("Concat", parts, ["zeros_shape"], axis=0),
                      h.make_node("ConstantOfShape", ["zeros_shape"], ["zeros"],
                                  value=nh.from_array(np.zeros(1, np.float32)))]
            init_h = "zeros"
            init_c = "zeros" if self.op == "LSTM" else ""
        lens = ""
        if self.lens:
            inputs.append(h.make_tensor_value_info("sequence_lens", T.INT32, [self.batch]))
            lens = "sequence_lens"
        ins = [x, "W", "R", "B", lens, init_h]
        if self.op == "LSTM":
            ins += [init_c, "P" if self.peepholes else ""]
        while ins and not ins[-1]:
            ins.pop()
        attrs = {"hidden_size": H, "direction": self.direction}
        if layout:
            attrs["layout"] = 1
        if self.op == "GRU" and self.linear_before_reset:
            attrs["linear_before_reset"] = 1
        if self.clip is not None:
            attrs["clip"] = self.clip
        if self.activations:
            attrs["activations"] = list(self.activations)
        if self.alpha:
            attrs["activation_alpha"] = list(self.alpha)
        if self.beta:
            attrs["activation_beta"] = list(self.beta)
        if self.input_forget:
            attrs["input_forget"] = 1
        wanted = [o for o in OUTPUTS[self.op] if o in self.outputs]
        outs = [o if o in wanted else "" for o in OUTPUTS[self.op]]
        while outs and not outs[-1]:
            outs.pop()
        if batch_first_io and layout == 0:
            inner = [f"{o}_op" if o else "" for o in outs]
            nodes.append(h.make_node(self.op, ins, inner, name="rnn", **attrs))
            for o in wanted:
                perm = [2, 0, 1, 3] if o == "Y" else [1, 0, 2]
                nodes.append(h.make_node("Transpose", [f"{o}_op"], [o], perm=perm))
        else:
            nodes.append(h.make_node(self.op, ins, outs, name="rnn", **attrs))
        shapes = {"Y": self.y_shape(), "Y_h": self.state_shape(), "Y_c": self.state_shape()}
        graph = h.make_graph(nodes, self.name, inputs,
                             [h.make_tensor_value_info(o, T.FLOAT, shapes[o]) for o in wanted],
                             initializer=inits)
        model = h.make_model(graph, opset_imports=[h.make_opsetid("", self.opset)])
        model.ir_version = 8
        onnx.checker.check_model(model)
        return onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)

    def feeds(self, seed: int = 1) -> dict:
        import numpy as np
        rng = np.random.default_rng(seed)
        out = {"X": rng.standard_normal(self.x_shape()).astype(np.float32)}
        if self.state == "input":
            out["initial_h"] = (rng.standard_normal(self.state_shape()) * 0.5).astype(np.float32)
            if self.op == "LSTM":
                out["initial_c"] = (rng.standard_normal(self.state_shape()) * 0.5).astype(np.float32)
        if self.lens:  # one full sequence, the others shorter (a length of 0 included at b > 2)
            out["sequence_lens"] = np.array([self.seq] + [(self.seq - 1 - k) % (self.seq + 1)
                                                          for k in range(self.batch - 1)], np.int32)
        return out


# ----------------------------------------------------------------------------- the family
ACTIVATIONS = {  # (activations for one direction, alpha, beta): what exporters and the spec use
    "LSTM": [(("HardSigmoid", "Tanh", "Tanh"), (0.25,), (0.45,)),      # Keras' hard_sigmoid
             (("Sigmoid", "Relu", "Relu"), (), ()),
             (("Sigmoid", "Softsign", "Elu"), (0.8,), ()),
             (("Sigmoid", "ScaledTanh", "LeakyRelu"), (1.5, 0.1), (0.7,))],
    "GRU": [(("HardSigmoid", "Tanh"), (), ()),                          # HardSigmoid's defaults
            (("Sigmoid", "Relu"), (), ()),
            (("Sigmoid", "Affine"), (0.5,), (0.2,)),
            (("ThresholdedRelu", "Softplus"), (0.1,), ())],
}


def recurrent_cases() -> list[Rnn]:
    """Every op x direction x layout x batch x state x opset, with the other axes (outputs
    subset, sequence_lens, linear_before_reset, clip, activations, peepholes, input_forget,
    computed weights) cycled through so that each of their values meets each op and direction.
    layout=1 exists from opset 14 on: at opset 13 the layout-1 cases are left out."""
    cases = []
    k = 0
    for op, direction, layout, batch, state, opset in itertools.product(
            ("LSTM", "GRU"), ("forward", "reverse", "bidirectional"), (0, 1), (1, 3),
            ("input", "none", "zeros"), (13, 18)):
        if layout and opset < 14:
            continue
        outs = OUTPUTS[op]
        subsets = [s for n in range(1, len(outs) + 1) for s in itertools.combinations(outs, n)]
        acts = ACTIVATIONS[op][k % len(ACTIVATIONS[op])] if k % 3 == 2 else ((), (), ())
        dirs = 2 if direction == "bidirectional" else 1
        cases.append(Rnn(
            op=op, direction=direction, layout=layout, batch=batch, state=state, opset=opset,
            outputs=subsets[k % len(subsets)], lens=k % 4 in (1, 2),
            linear_before_reset=k % 2 if op == "GRU" else 0,
            clip=(None, 0.8, None, 2.5, None)[k % 5],
            activations=acts[0] * dirs, alpha=acts[1] * dirs, beta=acts[2] * dirs,
            peepholes=op == "LSTM" and k % 3 == 1, input_forget=int(op == "LSTM" and k % 4 == 3),
            weights="computed" if k % 5 == 4 else "initializer"))
        k += 1
    return cases


def representative() -> list[Rnn]:
    """The few cases the product builds and compiles (IREE and TVM, opset 17): each op's
    streaming form (state in and out, batch 1), bidirectional with lengths, and every attribute
    the unrolling refused before (clip, activations with alpha/beta, peepholes, input_forget);
    3 steps each: compile time grows with the unrolled steps."""
    return [
        Rnn("LSTM", "forward", state="input", outputs=("Y", "Y_h", "Y_c"), seq=3),
        Rnn("GRU", "forward", state="input", outputs=("Y_h",), seq=3, linear_before_reset=1),
        Rnn("GRU", "bidirectional", seq=3, batch=2, state="zeros", outputs=("Y",), lens=True,
            clip=1.5),
        Rnn("LSTM", "reverse", seq=3, batch=2, state="input", outputs=("Y", "Y_c"), peepholes=True,
            input_forget=1, clip=2.0, activations=("HardSigmoid", "Tanh", "Tanh"), alpha=(0.25,),
            beta=(0.45,)),
        Rnn("GRU", "reverse", seq=3, state="input", outputs=("Y", "Y_h"),
            activations=("Sigmoid", "Affine"), alpha=(0.5,), beta=(0.2,), weights="computed"),
    ]


def batch_first() -> list[Rnn]:
    """layout=1 cases the product builds with IREE: onnxruntime does not run them, so golden
    runs them as `reference()` does (layout 0 between Transposes)."""
    return [Rnn("LSTM", "bidirectional", layout=1, seq=3, batch=2, state="input", lens=True,
                outputs=("Y", "Y_h", "Y_c"), peepholes=True),
            Rnn("GRU", "forward", layout=1, seq=3, state="input", outputs=("Y_h",), clip=1.0)]


# ----------------------------------------------------------------------------- Einsum
@dataclass(frozen=True)
class Einsum:
    equation: str
    shapes: tuple               # per operand
    weights: tuple = ()         # indices of operands that are initializers (the others inputs)
    opset: int = 13

    @property
    def name(self) -> str:
        eq = self.equation.replace("->", "_to_").replace(",", "_").replace("...", "E")
        return f"einsum_{eq}_w{''.join(map(str, self.weights)) or '-'}_op{self.opset}"

    def model(self, rng_seed: int = 0):
        import numpy as np
        import onnx
        from onnx import TensorProto as T
        from onnx import helper as h
        from onnx import numpy_helper as nh
        rng = np.random.default_rng(rng_seed)
        names = [f"w{i}" if i in self.weights else f"x{i}" for i in range(len(self.shapes))]
        inits = [nh.from_array(rng.standard_normal(s).astype(np.float32), n)
                 for n, s in zip(names, self.shapes) if n.startswith("w")]
        inputs = [h.make_tensor_value_info(n, T.FLOAT, list(s))
                  for n, s in zip(names, self.shapes) if n.startswith("x")]
        node = h.make_node("Einsum", names, ["y"], equation=self.equation, name="einsum")
        out = np.einsum(self.equation, *[np.zeros(s, np.float32) for s in self.shapes]).shape
        graph = h.make_graph([node], self.name, inputs, [h.make_tensor_value_info("y", T.FLOAT, out)],
                             initializer=inits)
        model = h.make_model(graph, opset_imports=[h.make_opsetid("", self.opset)])
        model.ir_version = 8
        onnx.checker.check_model(model)
        return onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)

    def feeds(self, seed: int = 1) -> dict:
        import numpy as np
        rng = np.random.default_rng(seed)
        return {f"x{i}": rng.standard_normal(s).astype(np.float32)
                for i, s in enumerate(self.shapes) if i not in self.weights}


def einsum_cases() -> list[Einsum]:
    """The forms exporters emit (PyTorch's torch.einsum, tf2onnx's tf.einsum), at opsets 13
    and 18, the second operand an input or a weight where both are seen."""
    forms = [
        Einsum("bij,bjk->bik", ((2, 3, 4), (2, 4, 5))),            # batched matmul
        Einsum("bhqd,bhkd->bhqk", ((1, 2, 3, 4), (1, 2, 5, 4))),   # attention scores
        Einsum("bhqk,bhkd->bhqd", ((1, 2, 3, 5), (1, 2, 5, 4))),   # attention values
        Einsum("bctf,cd->bdtf", ((1, 3, 4, 5), (3, 2)), (1,)),      # channel mixing (speech)
        Einsum("bnd,dh->bnh", ((2, 3, 4), (4, 6)), (1,)),          # a linear layer
        Einsum("bnd,hd->bnh", ((2, 3, 4), (6, 4)), (1,)),          # ... with W as stored
        Einsum("...ij,...jk->...ik", ((2, 3, 4), (2, 4, 5))),      # ellipsis
        Einsum("ij->ji", ((3, 4),)),                               # transpose
        Einsum("bij->bji", ((2, 3, 4),)),
        Einsum("bij->b", ((2, 3, 4),)),                            # reductions
        Einsum("ij->i", ((3, 4),)),
        Einsum("i,i->", ((5,), (5,))),                             # dot
        Einsum("i,j->ij", ((3,), (4,))),                           # outer product
        Einsum("btf,f->bt", ((2, 3, 4), (4,)), (1,)),              # weighted sum (pooling)
        Einsum("bij,bik->bjk", ((2, 4, 3), (2, 4, 5))),            # contraction over a non-last axis
    ]
    return forms + [replace(f, opset=18) for f in forms]


# ----------------------------------------------------------------------------- several in one
def combined(models: list, name: str = "family"):
    """Independent models side by side in one graph (names prefixed `c<k>_`), so that a compiler
    runs once for many cases: its per-model start-up is most of a tiny model's compile time."""
    import onnx
    from onnx import compose, helper
    opsets = {o.version for m in models for o in m.opset_import if o.domain in ("", "ai.onnx")}
    assert len(opsets) == 1, f"one opset per combined model, got {sorted(opsets)}"
    parts = [compose.add_prefix(m, f"c{k}_") for k, m in enumerate(models)]
    graph = helper.make_graph(
        [n for p in parts for n in p.graph.node], name,
        [i for p in parts for i in p.graph.input], [o for p in parts for o in p.graph.output],
        initializer=[t for p in parts for t in p.graph.initializer],
        value_info=[v for p in parts for v in p.graph.value_info])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opsets.pop())])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def combined_feeds(feeds: list[dict]) -> dict:
    return {f"c{k}_{name}": value for k, f in enumerate(feeds) for name, value in f.items()}
