"""`unroll-recurrent`: LSTM and GRU over a static sequence as MatMul/Sigmoid/Tanh per step, where a
compiler of ours lacks the op. Registered in static_rewrites.py.

Everything the ONNX spec defines for the two ops is unrolled, as onnxruntime (golden) computes it:
both layouts (`layout=1`: batch first, by Transposes around the sequence-first form), `clip`
(on every gate's input, after the biases, before its activation; not on the cell state),
`input_forget` (f = 1 - i), peepholes (P: i and f read the previous cell, o the new one), and
the spec's activation functions with their `activation_alpha`/`activation_beta` (consumed in
order along the list, each function taking what it uses, the operator's default when the list
runs out). What stays refused: weights that are not constants, a sequence without a static
shape, an activation name outside the spec, more than MAX_UNROLLED_STEPS steps x directions.
"""
from __future__ import annotations

from pathlib import Path

from .graph_edit import Facts, NoRewrite, _Builder, _attrs, _replace, _resolve, _text

MAX_UNROLLED_STEPS = 1024   # time steps x directions of one recurrent op unrolled, at most
GATE_ACTIVATIONS = {"LSTM": 3, "GRU": 2}   # f, g, h (LSTM); f, g (GRU)
DEFAULT_ACTIVATIONS = {"LSTM": ("Sigmoid", "Tanh", "Tanh"), "GRU": ("Sigmoid", "Tanh")}
# the spec's activation functions (lower case, as onnxruntime matches them) -> (name, default
# alpha or None when it takes none, default beta or None): the defaults of the ONNX operators
# of the same name (Affine and ScaledTanh: onnxruntime's)
ACTIVATION_FUNCTIONS = {
    "relu": ("Relu", None, None), "tanh": ("Tanh", None, None), "sigmoid": ("Sigmoid", None, None),
    "softsign": ("Softsign", None, None), "softplus": ("Softplus", None, None),
    "leakyrelu": ("LeakyRelu", 0.01, None), "thresholdedrelu": ("ThresholdedRelu", 1.0, None),
    "elu": ("Elu", 1.0, None), "hardsigmoid": ("HardSigmoid", 0.2, 0.5),
    "affine": ("Affine", 1.0, 0.0), "scaledtanh": ("ScaledTanh", 1.0, 1.0),
}


# ----------------------------------------------------------------------------- what is unrolled
def activation_functions(op: str, a: dict, dirs: int) -> list[list[tuple]]:
    """Per direction, the op's activations as (name, alpha, beta), alpha/beta consumed in order
    along the whole list as onnxruntime does; raises ValueError naming the attribute when the
    list is not one the spec defines."""
    names = [_text(x) for x in a.get("activations") or ()] or list(DEFAULT_ACTIVATIONS[op]) * dirs
    per_dir = GATE_ACTIVATIONS[op]
    if len(names) != per_dir * dirs:
        raise ValueError(f"activations {names} has {len(names)} names, {op} with {dirs} "
                         f"direction(s) takes {per_dir * dirs}")
    unknown = [n for n in names if n.lower() not in ACTIVATION_FUNCTIONS]
    if unknown:
        raise ValueError(f"activations {unknown} are not activation functions of the ONNX spec "
                         f"({', '.join(v[0] for v in ACTIVATION_FUNCTIONS.values())})")
    alphas, betas = list(a.get("activation_alpha") or ()), list(a.get("activation_beta") or ())
    funcs = []
    for name in names:
        canonical, alpha, beta = ACTIVATION_FUNCTIONS[name.lower()]
        if alpha is not None and alphas:
            alpha = alphas.pop(0)
        if beta is not None and betas:
            beta = betas.pop(0)
        funcs.append((canonical, alpha, beta))
    return [funcs[d * per_dir:(d + 1) * per_dir] for d in range(dirs)]


def _unroll_refusal(node, ins, a, inits, x_shape) -> str | None:
    """Why this LSTM/GRU cannot be unrolled, or None."""
    missing = [ins[i] for i in (1, 2, 3) if ins[i] and ins[i] not in inits]
    if node.op_type == "LSTM" and ins[7] and ins[7] not in inits:
        missing.append(ins[7])
    if missing:
        return f"its weights {missing} are not constants after simplifying"
    dirs = 2 if _text(a.get("direction", "forward")) == "bidirectional" else 1
    try:
        activation_functions(node.op_type, a, dirs)
    except ValueError as exc:
        return str(exc)
    if not x_shape or not all(isinstance(d, int) for d in x_shape):
        return f"its input {ins[0]!r} has no static shape"
    steps = x_shape[1] if a.get("layout", 0) else x_shape[0]
    if steps * dirs > MAX_UNROLLED_STEPS:
        return f"{steps} steps x {dirs} directions is more than {MAX_UNROLLED_STEPS} to unroll"
    return None


def unroll_recurrent(model, facts: Facts) -> list[str]:
    """LSTM and GRU over a static sequence, as one MatMul for the inputs of every step and, per
    step, MatMul/Add and the gates' activations on the state (both directions, both layouts,
    initial states, sequence_lens as a mask, clip, peepholes, input_forget). Applied where a
    compiler of ours lacks the op (`facts.lacking`). An instance it cannot unroll (weights
    computed at run time, ...) is left as it is for the compilers that take it
    (`facts.declined`), or fails, naming it, where none does (`facts.nowhere`: a bidirectional
    GRU)."""
    graph = model.graph
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
    replacements, touched = {}, []
    for k, node in enumerate(graph.node):
        if node.op_type not in ("LSTM", "GRU") or node.op_type not in facts.lacking:
            continue
        a = _attrs(node)
        ins = list(node.input) + [""] * (8 - len(node.input))
        inits = _resolve(model, [ins[1], ins[2], ins[3], ins[7] if node.op_type == "LSTM" else ""])
        x_shape = facts.shapes.get(ins[0])
        direction = _text(a.get("direction", "forward"))
        refusal = _unroll_refusal(node, ins, a, inits, x_shape)
        if refusal:
            _decline(node, direction, refusal, facts)
            continue
        b = _Builder(graph, node.name or node.output[0])
        _Unrolled(b, node, ins, a, inits, x_shape, opset).build()
        replacements[k] = b.nodes
        steps = x_shape[1] if a.get("layout", 0) else x_shape[0]
        touched.append(f"{node.name or node.output[0]} ({node.op_type}, {direction}, {steps} steps"
                       f"{_extras(node, a)})")
    _replace(graph, replacements)
    return touched


def _decline(node, direction: str, refusal: str, facts: Facts) -> None:
    """Leave the op for the compilers that take it (noted), or fail naming it when none does."""
    where = f"{node.op_type} {node.name or node.output[0]!r}"
    if f"{node.op_type}:{direction}" in facts.nowhere:
        raise NoRewrite(f"{where}: {refusal}, and no compiler of ours takes it as it is "
                        f"({facts.lacking[node.op_type]})")
    facts.declined.append({"rule": "unroll-recurrent", "node": node.name or node.output[0],
                           "why": f"{refusal}: left as it is, for the compilers that take it"})


def _extras(node, a: dict) -> str:
    """', layout=1, clip=2.0, ...': the attributes beyond the plain form, for the record."""
    extra = [f"{k}={a[k]}" for k in ("layout", "clip", "input_forget", "linear_before_reset")
             if a.get(k)]
    if a.get("activations"):
        extra.append(f"activations={[_text(x) for x in a['activations']]}")
    if node.op_type == "LSTM" and len(node.input) > 7 and node.input[7]:
        extra.append("peepholes")
    return "".join(f", {e}" for e in extra)


# ----------------------------------------------------------------------------- the unrolling
class _Unrolled:
    """The nodes of one unrolled LSTM/GRU, appended to a _Builder whose last nodes write the
    op's own outputs (so the graph around it is unchanged)."""

    def __init__(self, b: _Builder, node, ins, a, inits, x_shape, opset: int):
        import numpy as np  # numpy: 0.2 s, not needed by doit list
        self.b, self.node, self.ins, self.a, self.opset = b, node, ins, a, opset
        self.op = node.op_type
        self.layout = a.get("layout", 0)
        self.seq, self.batch = (x_shape[1], x_shape[0]) if self.layout else (x_shape[0], x_shape[1])
        self.direction = _text(a.get("direction", "forward"))
        self.dirs = 2 if self.direction == "bidirectional" else 1
        self.hidden = a["hidden_size"]
        self.gates = 4 if self.op == "LSTM" else 3
        self.clip = a.get("clip")
        self.funcs = activation_functions(self.op, a, self.dirs)
        self.w, self.r = inits[ins[1]], inits[ins[2]]
        self.bias = (inits[ins[3]] if ins[3]
                     else np.zeros((self.dirs, 2 * self.gates * self.hidden), np.float32))
        self.peep = inits.get(ins[7]) if self.op == "LSTM" and ins[7] else None

    # ------------------------------------------------------------------ small helpers
    def split(self, x, sizes: list[int]) -> list[str]:
        import numpy as np  # numpy: 0.2 s, not needed by doit list
        if self.opset >= 13:
            return self.b.op("Split", [x, self.b.const(np.array(sizes, np.int64), "split")],
                             n_out=len(sizes), axis=1)
        return self.b.op("Split", [x], n_out=len(sizes), axis=1, split=sizes)

    def unsqueeze(self, x, axes: list[int]) -> str:
        import numpy as np  # numpy: 0.2 s, not needed by doit list
        if self.opset >= 13:
            return self.b.op("Unsqueeze", [x, self.b.const(np.array(axes, np.int64), "axes")])
        return self.b.op("Unsqueeze", [x], axes=axes)

    def gate(self, x, func: tuple) -> str:
        """clip (when the op has it), then the activation function."""
        import numpy as np  # numpy: 0.2 s, not needed by doit list
        if self.clip is not None:
            lo, hi = np.array(-self.clip, np.float32), np.array(self.clip, np.float32)
            x = (self.b.op("Clip", [x, self.b.const(lo, "clip"), self.b.const(hi, "clip")])
                 if self.opset >= 11 else self.b.op("Clip", [x], min=float(lo), max=float(hi)))
        return self.activation(x, func)

    def activation(self, x, func: tuple) -> str:
        import numpy as np  # numpy: 0.2 s, not needed by doit list
        name, alpha, beta = func
        f32 = np.float32
        if name == "Affine":
            return self.b.op("Add", [self.b.op("Mul", [x, self.b.const(np.array(alpha, f32), "alpha")]),
                                     self.b.const(np.array(beta, f32), "beta")])
        if name == "ScaledTanh":
            inner = self.b.op("Tanh", [self.b.op("Mul", [x, self.b.const(np.array(beta, f32), "beta")])])
            return self.b.op("Mul", [inner, self.b.const(np.array(alpha, f32), "alpha")])
        attrs = {k: float(v) for k, v in (("alpha", alpha), ("beta", beta)) if v is not None}
        return self.b.op(name, [x], **attrs)

    # ------------------------------------------------------------------ the whole op
    def build(self) -> None:
        x = self.ins[0]
        if self.layout:  # batch first: the same computation on [seq, batch, ...]
            x = self.b.op("Transpose", [x], perm=[1, 0, 2])
        mask = self.mask() if self.ins[4] else None
        ys, hs, cs = [], [], []
        for d in range(self.dirs):
            y, h, c = self.direction_steps(x, d, mask)
            ys.append(self.b.op("Concat", [self.unsqueeze(v, [0, 1]) for v in y], axis=0))
            hs.append(self.unsqueeze(h, [0]))
            if c is not None:
                cs.append(self.unsqueeze(c, [0]))
        outs = list(self.node.output) + [""] * 3
        for value, parts, axis, perm in ((outs[0], ys, 1, [2, 0, 1, 3]), (outs[1], hs, 0, [1, 0, 2]),
                                         (outs[2], cs, 0, [1, 0, 2])):
            if not value:
                continue
            if self.layout:
                self.b.op("Transpose", [self.b.op("Concat", parts, axis=axis)], out=[value], perm=perm)
            else:
                self.b.op("Concat", parts, out=[value], axis=axis)

    def mask(self) -> str:
        """sequence_lens [batch] as [seq, batch, 1] floats: steps at or past a length keep the
        state and emit 0."""
        import numpy as np  # numpy: 0.2 s, not needed by doit list
        lens = self.b.op("Cast", [self.ins[4]], to=1)
        steps = self.b.const(np.arange(self.seq, dtype=np.float32).reshape(self.seq, 1, 1), "t")
        shape = self.b.const(np.array([1, self.batch, 1], np.int64), "shape")
        return self.b.op("Cast", [self.b.op("Less", [steps, self.b.op("Reshape", [lens, shape])])], to=1)

    def initial(self, index: int, d: int, what: str) -> str:
        """Direction d's initial state [batch, hidden]: from the op's input, else zeros."""
        import numpy as np  # numpy: 0.2 s, not needed by doit list
        if not self.ins[index]:
            return self.b.const(np.zeros((self.batch, self.hidden), np.float32), what)
        state = self.ins[index]
        axis = 1 if self.layout else 0    # [batch, dirs, hidden] in layout 1
        return self.b.op("Gather", [state, self.b.const(np.array(d, np.int64), "d")], axis=axis)

    def direction_steps(self, x, d: int, mask):
        """(the outputs of every step, the last state h, c) of direction d."""
        import numpy as np  # numpy: 0.2 s, not needed by doit list
        reverse = self.direction == "reverse" or d == 1
        h = self.initial(5, d, "h0")
        c = self.initial(6, d, "c0") if self.op == "LSTM" else None
        cell = _LstmCell(self, d) if self.op == "LSTM" else _GruCell(self, d)
        xw = cell.inputs(x)
        y = [None] * self.seq
        for t in (range(self.seq - 1, -1, -1) if reverse else range(self.seq)):
            x_t = self.b.op("Gather", [xw, self.b.const(np.array(t, np.int64), "t")], axis=0)
            h_new, c_new = cell.step(x_t, h, c)
            if mask is not None:
                m = self.b.op("Gather", [mask, self.b.const(np.array(t, np.int64), "t")], axis=0)
                y[t] = self.b.op("Mul", [h_new, m])
                h = self.b.op("Add", [h, self.b.op("Mul", [m, self.b.op("Sub", [h_new, h])])])
                if c_new is not None:
                    c = self.b.op("Add", [c, self.b.op("Mul", [m, self.b.op("Sub", [c_new, c])])])
            else:
                y[t], h, c = h_new, h_new, c_new
        return y, h, c


class _LstmCell:
    """One direction of an LSTM: gates i, o, f, c (the ONNX order), peepholes P = [i, o, f]."""

    def __init__(self, u: _Unrolled, d: int):
        import numpy as np  # numpy: 0.2 s, not needed by doit list
        self.u, self.b, H = u, u.b, u.hidden
        f, g, h = u.funcs[d]
        self.f, self.g, self.h = f, g, h
        wb, rb = u.bias[d, :4 * H], u.bias[d, 4 * H:]
        self.w_t = self.b.const(np.ascontiguousarray(u.w[d].T))
        self.bias = self.b.const((wb + rb).astype(np.float32))
        self.r_t = self.b.const(np.ascontiguousarray(u.r[d].T))
        self.p = None
        if u.peep is not None:
            p = u.peep[d].astype(np.float32)
            self.p = {k: self.b.const(np.ascontiguousarray(p[j * H:(j + 1) * H]), f"p{k}")
                      for j, k in enumerate("iof")}

    def inputs(self, x) -> str:
        """Every step's X W^T + Wb + Rb at once: [seq, batch, 4H]."""
        return self.b.op("Add", [self.b.op("MatMul", [x, self.w_t]), self.bias])

    def step(self, x_t, h, c):
        import numpy as np  # numpy: 0.2 s, not needed by doit list
        b, u = self.b, self.u
        pre = b.op("Add", [x_t, b.op("MatMul", [h, self.r_t])])
        i_, o_, f_, c_ = u.split(pre, [u.hidden] * 4)
        if self.p:
            i_ = b.op("Add", [i_, b.op("Mul", [self.p["i"], c])])
            f_ = b.op("Add", [f_, b.op("Mul", [self.p["f"], c])])
        i = u.gate(i_, self.f)
        if u.a.get("input_forget", 0):
            f = b.op("Sub", [b.const(np.array(1.0, np.float32), "one"), i])
        else:
            f = u.gate(f_, self.f)
        c_new = b.op("Add", [b.op("Mul", [f, c]), b.op("Mul", [i, u.gate(c_, self.g)])])
        if self.p:
            o_ = b.op("Add", [o_, b.op("Mul", [self.p["o"], c_new])])
        h_new = b.op("Mul", [u.gate(o_, self.f), u.activation(c_new, self.h)])
        return h_new, c_new


class _GruCell:
    """One direction of a GRU: gates z, r, h; h's recurrent bias depends on the reset gate
    (inside it with linear_before_reset=1, after the product with R otherwise)."""

    def __init__(self, u: _Unrolled, d: int):
        import numpy as np  # numpy: 0.2 s, not needed by doit list
        self.u, self.b, H = u, u.b, u.hidden
        self.f, self.g = u.funcs[d]
        wb, rb = u.bias[d, :3 * H], u.bias[d, 3 * H:]
        self.w_t = self.b.const(np.ascontiguousarray(u.w[d].T))
        self.bias = self.b.const(np.concatenate([wb[:2 * H] + rb[:2 * H], wb[2 * H:]]).astype(np.float32))
        self.rzr = self.b.const(np.ascontiguousarray(u.r[d, :2 * H].T))
        self.rh = self.b.const(np.ascontiguousarray(u.r[d, 2 * H:].T))
        self.rbh = self.b.const(rb[2 * H:].astype(np.float32))

    def inputs(self, x) -> str:
        """Every step's X W^T + biases (z, r: both; h: Wb only): [seq, batch, 3H]."""
        return self.b.op("Add", [self.b.op("MatMul", [x, self.w_t]), self.bias])

    def step(self, x_t, h, c):
        b, u, H = self.b, self.u, self.u.hidden
        xz_r, xh = u.split(x_t, [2 * H, H])
        zr = u.gate(b.op("Add", [xz_r, b.op("MatMul", [h, self.rzr])]), self.f)
        z, r = u.split(zr, [H, H])
        if u.a.get("linear_before_reset", 0):
            hh = b.op("Mul", [r, b.op("Add", [b.op("MatMul", [h, self.rh]), self.rbh])])
        else:
            hh = b.op("Add", [b.op("MatMul", [b.op("Mul", [r, h]), self.rh]), self.rbh])
        n = u.gate(b.op("Add", [xh, hh]), self.g)
        return b.op("Add", [n, b.op("Mul", [z, b.op("Sub", [h, n])])]), None   # (1-z)n + zh


# ----------------------------------------------------------------------------- batch first
def sequence_first(path, folder):
    """The model at `path` with every batch-first (`layout=1`) LSTM/GRU/RNN as the same op in
    layout 0 between Transposes, written to folder/sequence_first.onnx: the spec defines the
    batch-first form as exactly that, and onnxruntime (1.32) runs only layout 0 ("Batchwise
    recurrent operations (layout == 1) are not supported"). For the golden stage's reference."""

    import onnx  # onnx: 1.5 s, not needed by doit list
    from onnx import helper  # onnx: 1.5 s, not needed by doit list
    model = onnx.load(str(path))
    nodes = []
    for node in model.graph.node:
        a = _attrs(node)
        if node.op_type not in ("LSTM", "GRU", "RNN") or not a.get("layout", 0):
            nodes.append(node)
            continue
        stem = node.name or node.output[0]
        ins, outs = list(node.input), list(node.output)
        for k in (0, 5, 6):  # X [batch, seq, in]; initial_h, initial_c [batch, dirs, H]
            if k < len(ins) and ins[k]:
                nodes.append(helper.make_node("Transpose", [ins[k]], [f"{stem}__seq_first_in{k}"],
                                              perm=[1, 0, 2]))
                ins[k] = f"{stem}__seq_first_in{k}"
        for k, value in enumerate(outs):  # Y [seq, dirs, batch, H]; Y_h, Y_c [dirs, batch, H]
            if value:
                outs[k] = f"{stem}__seq_first_out{k}"
                nodes.append(helper.make_node("Transpose", [outs[k]], [value],
                                              perm=[2, 0, 1, 3] if k == 0 else [1, 0, 2]))
        attrs = {k: v for k, v in a.items() if k != "layout"}
        nodes.insert(len(nodes) - sum(1 for v in node.output if v),
                     helper.make_node(node.op_type, ins, outs, name=node.name, **attrs))
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    out = Path(folder) / "sequence_first.onnx"
    onnx.save(model, str(out))
    return out
