"""Graph surgery of the `static` stage: rewrites the anchors (onnxsim, shape inference) don't do.

Each rewrite is one function `(model, facts) -> [names of the nodes it replaced]`, registered in
`REWRITES` with its phase and why it exists. It changes the graph only where its pattern is
present (an empty list: nothing touched), and raises `NoRewrite` naming the op and the reason when
the pattern is there but the rewrite cannot take it. The static stage applies them in registry
order, lists each that touched something in static.json (`rewrites`: rule, nodes, why) and then
compares the rewritten model with golden in onnxruntime, as for every static model.

Phases: `before` runs on the bound model before it is simplified (onnxsim and shape inference
cannot see through what these remove: an `If` on a bound input, com.microsoft ops), `after` on
the simplified model with strictly inferred, static shapes.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

MAX_UNROLLED_STEPS = 1024   # time steps x directions of one recurrent op unrolled, at most


class NoRewrite(Exception):
    """The pattern is present, and the rewrite cannot take this instance: the message says why."""


@dataclass
class Facts:
    """What a rewrite may rely on: the spec's constant inputs, the shapes of the graph."""
    constants: dict = field(default_factory=dict)   # input name -> numpy array the spec fixes
    shapes: dict = field(default_factory=dict)      # tensor name -> static dims (after phase)
    lacking: dict = field(default_factory=dict)     # op -> which compilers cannot take it, why
    nowhere: set = field(default_factory=set)       # "op:direction" no compiler takes at all
    declined: list = field(default_factory=list)    # rewrites that could not apply, left as is


@dataclass(frozen=True)
class Rewrite:
    name: str
    phase: str                       # "before" or "after" simplification
    apply: Callable                  # (model, facts) -> names of the nodes replaced
    why: str


# ----------------------------------------------------------------------------- helpers
def _dims(value_info) -> list:
    tt = value_info.type.tensor_type
    if not tt.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else (d.dim_param or "?")
            for d in tt.shape.dim]


def subgraphs(graph):
    """The subgraphs of a graph's nodes (If branches, Loop/Scan bodies), one level down."""
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("g"):
                yield attr.g
            yield from attr.graphs


def _attrs(node) -> dict:
    from onnx import helper
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _text(value):
    return value.decode() if isinstance(value, bytes) else value


def _inits(graph) -> dict:
    from onnx import numpy_helper
    return {t.name: numpy_helper.to_array(t) for t in graph.initializer}


def _constant_values(graph) -> dict:
    """Initializers and Constant node outputs of one graph, as arrays."""
    from onnx import numpy_helper
    values = _inits(graph)
    for node in graph.node:
        if node.op_type == "Constant" and len(node.attribute) == 1:
            a = node.attribute[0]
            if a.name == "value":
                values[node.output[0]] = numpy_helper.to_array(a.t)
    return values


def _resolve(model, names) -> dict:
    """The values of `names` that are computed from constants only (onnxsim leaves large folded
    tensors, such as an LSTM's Unsqueezed weights, as nodes), evaluated by onnx's reference."""
    graph = model.graph
    values = _constant_values(graph)
    producer = {o: n for n in graph.node for o in n.output}

    def value(name, depth=0):
        if name in values or depth > 16:
            return values.get(name)
        node = producer.get(name)
        if node is None or any(a.HasField("g") or a.graphs for a in node.attribute):
            return None
        ins = {i: value(i, depth + 1) for i in node.input if i}
        if any(v is None for v in ins.values()):
            return None
        for out, v in zip(node.output, _evaluate_node(model.opset_import, node, ins)):
            values[out] = v
        return values.get(name)

    return {n: v for n in names if n and (v := value(n)) is not None}


def _outer_names(graph) -> set[str]:
    """Names a graph's subgraphs read from outer scopes, at any depth."""
    found = set()
    for sub in subgraphs(graph):
        defined = ({t.name for t in sub.initializer} | {i.name for i in sub.input}
                   | {o for n in sub.node for o in n.output})
        used = {i for n in sub.node for i in n.input if i} | _outer_names(sub)
        found |= used - defined
    return found


class _Builder:
    """New nodes and initializers, with names that cannot clash with the graph's own."""

    def __init__(self, graph, stem: str):
        self.graph, self.stem, self.nodes, self.k = graph, stem, [], 0

    def name(self, what: str) -> str:
        self.k += 1
        return f"{self.stem}__{what}_{self.k}"

    def const(self, array, what: str = "c") -> str:
        from onnx import numpy_helper
        name = self.name(what)
        self.graph.initializer.append(numpy_helper.from_array(array, name))
        return name

    def op(self, op_type: str, inputs: list, n_out: int = 1, out: list | None = None, **attrs):
        from onnx import helper
        outs = out or [self.name(op_type.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=self.name(op_type), **attrs))
        return outs[0] if len(outs) == 1 else outs


def _replace(graph, replacements: dict) -> None:
    """Put each replaced node's new nodes where it stood (the order stays topological)."""
    nodes = []
    for k, node in enumerate(graph.node):
        nodes.extend(replacements.get(k, [node]))
    del graph.node[:]
    graph.node.extend(nodes)


# ----------------------------------------------------------------------------- fold If / Where
def fold_constant_branches(model, facts: Facts) -> list[str]:
    """An `If` (or `Where`) whose condition is computed only from constants and inputs the spec
    binds to one value: the If is replaced by the nodes of the branch taken, the Where by the
    operand picked. The folded input stays a graph input, now unread."""
    import numpy as np
    if not facts.constants:
        return []
    graph = model.graph
    producer = {o: n for n in graph.node for o in n.output}
    known = {**_constant_values(graph), **facts.constants}
    targets = [(k, n) for k, n in enumerate(graph.node) if n.op_type in ("If", "Where")]
    replacements, touched = {}, []
    for k, node in targets:
        cond = node.input[0]
        needed, todo, ok = [], [cond], True
        seen = set()
        while todo:  # the nodes the condition depends on, back to known values
            name = todo.pop()
            if name in known or name in seen or not name:
                continue
            seen.add(name)
            prod = producer.get(name)
            if prod is None or any(a.HasField("g") or a.graphs for a in prod.attribute):
                ok = False
                break
            needed.append(prod)
            todo.extend(prod.input)
        if not ok:
            continue
        leaves = sorted({i for n in needed for i in n.input if i in known} | ({cond} & set(known)))
        from_spec = [x for x in leaves if x in facts.constants]
        if not from_spec:
            continue  # constant without the spec: onnxsim folds it
        order = [n for n in graph.node if n in needed]
        value = np.asarray(known[cond] if not order else _evaluate(
            model.opset_import, order, cond, {n: known[n] for n in leaves}))
        if node.op_type == "Where":
            if value.size == 0 or not (value.all() or not value.any()):
                continue
            pick, other = node.input[1:] if value.all() else node.input[:0:-1]
            b = _Builder(graph, node.name or node.output[0])  # the shape Where broadcasts to
            wide = b.op("Expand", [pick, b.op("Shape", [cond])])
            b.op("Expand", [wide, b.op("Shape", [other])], out=[node.output[0]])
            replacements[k] = b.nodes
        else:
            if value.size != 1:
                continue
            branch = _attrs(node)["then_branch" if bool(value.reshape(-1)[0]) else "else_branch"]
            replacements[k] = _inline(graph, node, branch)
        taken = ("then" if bool(value.reshape(-1)[0]) else "else") if node.op_type == "If" else \
            ("X" if value.all() else "Y")
        touched.append(f"{node.name or node.output[0]} ({node.op_type}: {taken} taken, "
                       f"{', '.join(from_spec)} bound by the spec)")
    _replace(graph, replacements)
    return touched


def _evaluate(opset_import, nodes, output: str, feeds: dict):
    """The value of `output` computed by `nodes` from constant `feeds` (onnx's reference
    evaluator)."""
    from onnx import helper, numpy_helper
    from onnx.reference import ReferenceEvaluator
    graph = helper.make_graph(nodes, "condition", [], [helper.make_tensor_value_info(output, 0, None)],
                              initializer=[numpy_helper.from_array(v, n) for n, v in feeds.items()])
    return ReferenceEvaluator(helper.make_model(graph, opset_imports=opset_import)).run(None, {})[0]


def _inline(graph, node, branch) -> list:
    """The branch's nodes in the outer graph: its initializers become outer initializers, every
    name it defines gets a prefix (outer names keep theirs), its outputs become the If's."""
    from onnx import helper
    prefix = f"{node.name or node.output[0]}__inl__"
    local = ({t.name for t in branch.initializer} | {o for n in branch.node for o in n.output})
    results = {}
    for o, out in zip(branch.output, node.output):
        results.setdefault(o.name, out)
    rename = {name: results.get(name, prefix + name) for name in local}

    def renamed(g, names: dict):
        """Rename in a nested subgraph the outer names it reads (its own names shadow them)."""
        own = ({t.name for t in g.initializer} | {i.name for i in g.input}
               | {o for n in g.node for o in n.output})
        inner = {k: v for k, v in names.items() if k not in own}
        for n in g.node:
            n.input[:] = [inner.get(i, i) for i in n.input]
            for a in n.attribute:
                if a.HasField("g"):
                    renamed(a.g, inner)
                for sg in a.graphs:
                    renamed(sg, inner)
        for o in g.output:
            o.name = inner.get(o.name, o.name)

    for t in branch.initializer:
        copy = graph.initializer.add()
        copy.CopyFrom(t)
        copy.name = rename[t.name]
    nodes = []
    for n in branch.node:
        new = type(n)()
        new.CopyFrom(n)
        new.input[:] = [rename.get(i, i) for i in n.input]
        new.output[:] = [rename.get(o, o) for o in n.output]
        new.name = prefix + (n.name or n.output[0])
        for a in new.attribute:
            if a.HasField("g"):
                renamed(a.g, rename)
            for sg in a.graphs:
                renamed(sg, rename)
        nodes.append(new)
    for o, out in zip(branch.output, node.output):  # an outer name, or a value given twice
        if rename.get(o.name, o.name) != out:
            nodes.append(helper.make_node("Identity", [rename.get(o.name, o.name)], [out],
                                          name=prefix + "out_" + out))
    return nodes


# ----------------------------------------------------------------------------- contrib ops
def _dequantized(inits, q: str, scale: str, zero: str | None, axis_of_channel: int | None = None):
    import numpy as np
    w = inits[q].astype(np.float32)
    s = inits[scale].astype(np.float32)
    z = inits[zero].astype(np.float32) if zero else np.float32(0)
    if s.ndim and axis_of_channel is not None and s.size > 1:  # per output channel
        shape = [1] * w.ndim
        shape[axis_of_channel] = -1
        s, z = s.reshape(shape), (z.reshape(shape) if np.ndim(z) else z)
    return ((w - z) * s).astype(np.float32)


def decompose_contrib_ops(model, facts: Facts) -> list[str]:
    """onnxruntime's com.microsoft ops, which no compiler takes, as standard ONNX:
    DynamicQuantizeLSTM -> LSTM on the dequantized weights; DynamicQuantizeMatMul -> MatMul (+ Add)
    on the dequantized weights. Both dequantize their activations on the fly in onnxruntime: the
    float op skips that rounding (the golden check shows by how much)."""
    graph = model.graph
    inits = _inits(graph)
    replacements, touched = {}, []
    for k, node in enumerate(graph.node):
        if node.domain != "com.microsoft":
            continue
        b = _Builder(graph, node.name or node.output[0])
        ins = list(node.input) + [""] * (12 - len(node.input))
        if node.op_type == "DynamicQuantizeLSTM":
            missing = [ins[i] for i in (1, 2, 8, 9, 10, 11) if ins[i] not in inits]
            if missing:
                raise NoRewrite(f"DynamicQuantizeLSTM {node.name!r}: its weights {missing} are not "
                                f"constants, so they cannot be dequantized ahead of time")
            # W: [dirs, input, 4H], R: [dirs, H, 4H]; per-direction (or per-channel) scales
            w = _dequant_rnn(inits, ins[1], ins[8], ins[9])
            r = _dequant_rnn(inits, ins[2], ins[10], ins[11])
            lstm_in = [ins[0], b.const(w, "W"), b.const(r, "R")] + ins[3:8]
            while lstm_in and not lstm_in[-1]:
                lstm_in.pop()
            attrs = _attrs(node)
            b.op("LSTM", lstm_in, out=list(node.output), **attrs)
        elif node.op_type == "DynamicQuantizeMatMul":
            # A (float), B (int8/uint8 constant), b_scale, b_zero_point, bias
            if ins[1] not in inits or ins[2] not in inits or (ins[3] and ins[3] not in inits):
                raise NoRewrite(f"DynamicQuantizeMatMul {node.name!r}: B, its scale and zero "
                                f"point must be constants")
            w = _dequantized(inits, ins[1], ins[2], ins[3] or None, axis_of_channel=-1)
            if ins[4]:
                out = b.op("MatMul", [ins[0], b.const(w, "B")])
                b.op("Add", [out, ins[4]], out=[node.output[0]])
            else:
                b.op("MatMul", [ins[0], b.const(w, "B")], out=[node.output[0]])
        else:
            raise NoRewrite(f"com.microsoft {node.op_type} ({node.name or node.output[0]}): no "
                            f"compiler takes onnxruntime's contrib ops and no rewrite into "
                            f"standard ONNX is known for this one (DynamicQuantizeLSTM and "
                            f"DynamicQuantizeMatMul are)")
        replacements[k] = b.nodes
        touched.append(node.name or node.output[0])
    _replace(graph, replacements)
    if touched and not any(n.domain == "com.microsoft" for n in graph.node):
        keep = [o for o in model.opset_import if o.domain != "com.microsoft"]
        del model.opset_import[:]
        model.opset_import.extend(keep)
    return touched


def _dequant_rnn(inits, q: str, scale: str, zero: str):
    """DynamicQuantizeLSTM's W [dirs, in, 4H] (R [dirs, H, 4H]) in float, transposed to the
    LSTM layout [dirs, 4H, in]; the scale is per direction, or per direction and column."""
    import numpy as np
    w = inits[q].astype(np.float32)
    s = inits[scale].astype(np.float32)
    z = inits[zero].astype(np.float32)
    dirs = w.shape[0]
    s = s.reshape(dirs, 1, -1)
    z = z.reshape(dirs, 1, -1)
    return np.ascontiguousarray(((w - z) * s).transpose(0, 2, 1)).astype(np.float32)


# ----------------------------------------------------------------------------- unroll LSTM / GRU
def _unroll_refusal(node, ins, a, inits, x_shape) -> str | None:
    """Why this LSTM/GRU cannot be unrolled, or None."""
    missing = [ins[i] for i in (1, 2, 3) if ins[i] and ins[i] not in inits]
    if missing:
        return f"its weights {missing} are not constants after simplifying"
    odd = [k for k, v in (("layout", a.get("layout", 0)), ("clip", a.get("clip")),
                          ("input_forget", a.get("input_forget", 0))) if v]
    if odd:
        return f"{', '.join(f'{k}={a[k]}' for k in odd)}: not unrolled"
    if a.get("activations") and [_text(x) for x in a["activations"]] not in (
            ["Sigmoid", "Tanh", "Tanh"] * 2, ["Sigmoid", "Tanh", "Tanh"],
            ["Sigmoid", "Tanh"] * 2, ["Sigmoid", "Tanh"]):
        return f"activations {[_text(x) for x in a['activations']]} are not unrolled"
    if node.op_type == "LSTM" and ins[7]:
        return "peephole weights (P) are not unrolled"
    if not x_shape or not all(isinstance(d, int) for d in x_shape):
        return f"its input {ins[0]!r} has no static shape"
    dirs = 2 if _text(a.get("direction", "forward")) == "bidirectional" else 1
    if x_shape[0] * dirs > MAX_UNROLLED_STEPS:
        return f"{x_shape[0]} steps x {dirs} directions is more than {MAX_UNROLLED_STEPS} to unroll"
    return None


def unroll_recurrent(model, facts: Facts) -> list[str]:
    """LSTM and GRU over a static sequence, as one MatMul for the inputs of every step and, per
    step, MatMul/Add/Sigmoid/Tanh/Mul on the state (forward and reverse directions, initial
    states, sequence_lens as a mask). Applied where a compiler of ours lacks the op
    (`facts.lacking`). An instance it cannot unroll (peepholes, clip, ...) is left as it is for
    the compilers that take it (`facts.declined`), or fails, naming it, where none does
    (`facts.nowhere`: a bidirectional GRU)."""
    import numpy as np
    graph = model.graph
    replacements, touched = {}, []
    for k, node in enumerate(graph.node):
        if node.op_type not in ("LSTM", "GRU") or node.op_type not in facts.lacking:
            continue
        inits = _resolve(model, node.input[1:4])
        where = f"{node.op_type} {node.name or node.output[0]!r}"
        a = _attrs(node)
        ins = list(node.input) + [""] * (8 - len(node.input))
        x_shape = facts.shapes.get(ins[0])
        refusal = _unroll_refusal(node, ins, a, inits, x_shape)
        if refusal:
            direction = _text(a.get("direction", "forward"))
            if f"{node.op_type}:{direction}" in facts.nowhere:
                raise NoRewrite(f"{where}: {refusal}, and no compiler of ours takes it as it is "
                                f"({facts.lacking[node.op_type]})")
            facts.declined.append({"rule": "unroll-recurrent", "node": node.name or node.output[0],
                                   "why": f"{refusal}: left as it is, for the compilers that take it"})
            continue
        seq, batch, _ = x_shape
        direction = _text(a.get("direction", "forward"))
        dirs = 2 if direction == "bidirectional" else 1
        hidden = a["hidden_size"]
        gates = 4 if node.op_type == "LSTM" else 3
        w, r = inits[ins[1]], inits[ins[2]]
        bias = inits[ins[3]] if ins[3] else np.zeros((dirs, 2 * gates * hidden), np.float32)
        b = _Builder(graph, node.name or node.output[0])
        mask = None
        if ins[4]:  # sequence_lens [batch]: steps at or past a length keep the state, emit 0
            lens = b.op("Cast", [ins[4]], to=1)
            steps = b.const(np.arange(seq, dtype=np.float32).reshape(seq, 1, 1), "t")
            mask = b.op("Cast", [b.op("Less", [steps, b.op("Reshape", [lens, b.const(
                np.array([1, batch, 1], np.int64), "shape")])])], to=1)       # [seq, batch, 1]
        ys, hs, cs = [], [], []
        for d in range(dirs):
            reverse = direction == "reverse" or d == 1
            h = (b.op("Gather", [ins[5], b.const(np.array(d, np.int64), "d")], axis=0) if ins[5]
                 else b.const(np.zeros((batch, hidden), np.float32), "h0"))
            c = None
            if node.op_type == "LSTM":
                c = (b.op("Gather", [ins[6], b.const(np.array(d, np.int64), "d")], axis=0) if ins[6]
                     else b.const(np.zeros((batch, hidden), np.float32), "c0"))
            wb, rb = bias[d, :gates * hidden], bias[d, gates * hidden:]
            if node.op_type == "LSTM":
                xw = b.op("Add", [b.op("MatMul", [ins[0], b.const(np.ascontiguousarray(w[d].T))]),
                                  b.const((wb + rb).astype(np.float32))])     # [seq, batch, 4H]
                rt = b.const(np.ascontiguousarray(r[d].T))
            else:  # GRU: z, r gates take both biases; h's recurrent bias depends on the reset
                xw = b.op("Add", [b.op("MatMul", [ins[0], b.const(np.ascontiguousarray(w[d].T))]),
                                  b.const(np.concatenate([wb[:2 * hidden] + rb[:2 * hidden],
                                                          wb[2 * hidden:]]).astype(np.float32))])
                rzr = b.const(np.ascontiguousarray(r[d, :2 * hidden].T))
                rh = b.const(np.ascontiguousarray(r[d, 2 * hidden:].T))
                rbh = b.const(rb[2 * hidden:].astype(np.float32))
            split = b.const(np.array([hidden] * gates, np.int64), "split")
            split2 = b.const(np.array([hidden] * 2, np.int64), "split")
            y = [None] * seq
            for t in (range(seq - 1, -1, -1) if reverse else range(seq)):
                x_t = b.op("Gather", [xw, b.const(np.array(t, np.int64), "t")], axis=0)
                if node.op_type == "LSTM":
                    g = b.op("Add", [x_t, b.op("MatMul", [h, rt])])
                    i_, o_, f_, c_ = b.op("Split", [g, split], n_out=4, axis=1)
                    c_new = b.op("Add", [b.op("Mul", [b.op("Sigmoid", [f_]), c]),
                                         b.op("Mul", [b.op("Sigmoid", [i_]), b.op("Tanh", [c_])])])
                    h_new = b.op("Mul", [b.op("Sigmoid", [o_]), b.op("Tanh", [c_new])])
                else:
                    xz_r, xh = b.op("Split", [x_t, b.const(np.array([2 * hidden, hidden], np.int64),
                                                             "split")], n_out=2, axis=1)
                    zr = b.op("Sigmoid", [b.op("Add", [xz_r, b.op("MatMul", [h, rzr])])])
                    z, rr = b.op("Split", [zr, split2], n_out=2, axis=1)
                    if a.get("linear_before_reset", 0):
                        hh = b.op("Mul", [rr, b.op("Add", [b.op("MatMul", [h, rh]), rbh])])
                    else:
                        hh = b.op("Add", [b.op("MatMul", [b.op("Mul", [rr, h]), rh]), rbh])
                    n = b.op("Tanh", [b.op("Add", [xh, hh])])
                    h_new = b.op("Add", [n, b.op("Mul", [z, b.op("Sub", [h, n])])])  # (1-z)n + zh
                    c_new = None
                if mask is not None:
                    m = b.op("Gather", [mask, b.const(np.array(t, np.int64), "t")], axis=0)
                    y[t] = b.op("Mul", [h_new, m])
                    h = b.op("Add", [h, b.op("Mul", [m, b.op("Sub", [h_new, h])])])
                    if c_new is not None:
                        c = b.op("Add", [c, b.op("Mul", [m, b.op("Sub", [c_new, c])])])
                else:
                    y[t], h, c = h_new, h_new, c_new
            axes01 = b.const(np.array([0, 1], np.int64), "axes")
            ys.append(b.op("Concat", [b.op("Unsqueeze", [v, axes01]) for v in y], axis=0))
            axes0 = b.const(np.array([0], np.int64), "axes")
            hs.append(b.op("Unsqueeze", [h, axes0]))
            if c is not None:
                cs.append(b.op("Unsqueeze", [c, axes0]))
        outs = list(node.output) + [""] * 3
        for value, parts, axis in ((outs[0], ys, 1), (outs[1], hs, 0), (outs[2], cs, 0)):
            if value:
                b.op("Concat", parts, out=[value], axis=axis)
        replacements[k] = b.nodes
        touched.append(f"{node.name or node.output[0]} ({node.op_type}, {direction}, {seq} steps)")
    _replace(graph, replacements)
    return touched


# ----------------------------------------------------------------------------- reflect Pad
def _reflect_indices(size: int, before: int, after: int):
    import numpy as np
    idx = np.abs(np.arange(-before, size + after))          # reflect about the first element
    return np.where(idx > size - 1, 2 * (size - 1) - idx, idx).astype(np.int64)  # ... and the last


def reflect_pads_as_gathers(model) -> list[str]:
    """Replace each reflect Pad with constant pads by Gathers along its padded axes; returns the
    names of the nodes replaced. Needs the shapes of strict shape inference.

    IREE 3.13 (llvm-cpu) cannot compile some reflect Pads: basic-pitch's [1, 1, 43844] ->
    [1, 1, 44100] fails with `'linalg.generic' op inferred input/output operand #0 has shape's
    dimension #0 to be greater than or equal to 128, but found 113` (the tiled reversed slice).
    Measured on one-Pad models: padding the innermost axis of [1, 1, 1000] (or [1, 1000]) by 64
    or 128 fails, by 8 or 127 compiles; 128 on a non-innermost axis compiles. The rank is not the
    cause. A reflect Pad only copies elements, so every reflect Pad with constant pads becomes
    one Gather per padded axis with the constant indices reflection reads: the same values, bit
    for bit."""
    from onnx import helper, numpy_helper
    inits = {t.name: t for t in model.graph.initializer}
    shapes = {vi.name: _dims(vi) for vi in list(model.graph.input) + list(model.graph.value_info)}
    nodes, replaced = [], []
    for k, node in enumerate(model.graph.node):
        mode = next((a.s.decode() for a in node.attribute if a.name == "mode"), "constant")
        shape = shapes.get(node.input[0]) if node.op_type == "Pad" else None
        if mode != "reflect" or not shape or node.input[1] not in inits:
            nodes.append(node)
            continue
        pads = numpy_helper.to_array(inits[node.input[1]]).tolist()
        rank = len(shape)
        axes = list(range(rank))
        if len(node.input) > 3 and node.input[3]:  # opset 18+: pads only for the listed axes
            if node.input[3] not in inits:
                nodes.append(node)
                continue
            axes = [a % rank for a in numpy_helper.to_array(inits[node.input[3]]).tolist()]
        n = len(axes)
        todo = [(a, pads[i], pads[i + n]) for i, a in enumerate(axes) if pads[i] or pads[i + n]]
        if not todo or any(b < 0 or e < 0 or b >= shape[a] or e >= shape[a] for a, b, e in todo):
            nodes.append(node)  # nothing to pad, or a crop / an invalid reflect: leave it as it is
            continue
        current = node.input[0]
        for j, (axis, before, after) in enumerate(todo):
            stem = f"{node.output[0]}__reflect_axis{axis}"
            model.graph.initializer.append(
                numpy_helper.from_array(_reflect_indices(shape[axis], before, after), f"{stem}_indices"))
            out = node.output[0] if j == len(todo) - 1 else stem
            nodes.append(helper.make_node("Gather", [current, f"{stem}_indices"], [out], axis=axis,
                                          name=f"{node.name or f'Pad_{k}'}__gather_axis{axis}"))
            current = out
        replaced.append(node.name or f"Pad_{k}")
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return replaced


# ----------------------------------------------------------------------------- the registry
def _reflect_pads(model, facts: Facts) -> list[str]:
    return reflect_pads_as_gathers(model)


REWRITES = (
    Rewrite("fold-constant-if", "before", fold_constant_branches,
            "the condition is fixed once the spec binds an input to one value: the other "
            "branch is dead code, and an If left in has the shapes of both branches (dynamic "
            "where they differ); the artifact is specialised to that value"),
    Rewrite("decompose-contrib-ops", "before", decompose_contrib_ops,
            "onnxruntime's com.microsoft ops are accepted by neither IREE nor TVM"),
    Rewrite("reflect-pad-as-gather", "after", _reflect_pads,
            "IREE 3.13 llvm-cpu fails to compile reflect Pad of this size; Gather with constant "
            "indices copies the same elements"),
    Rewrite("unroll-recurrent", "after", unroll_recurrent,
            "a compiler of ours lacks the op (see `lacking`); over a static sequence it is "
            "MatMul/Sigmoid/Tanh per step"),
)


def apply(model, phase: str, facts: Facts) -> list[dict]:
    """Apply the phase's rewrites in order; the records of those that touched something."""
    records = []
    for rw in REWRITES:
        if rw.phase != phase:
            continue
        touched = rw.apply(model, facts)
        if touched:
            why = rw.why
            if rw.name == "unroll-recurrent":
                ops = sorted({t.split("(")[1].split(",")[0] for t in touched})
                why = "; ".join(f"{op}: {facts.lacking[op]}" for op in ops) + \
                    "; unrolled over the static sequence into MatMul/Sigmoid/Tanh"
            records.append({"rule": rw.name, "nodes": touched, "why": why})
    return records


# ----------------------------------------------------------------------------- second simplifier
NONDETERMINISTIC = {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike",
                    "Multinomial", "Bernoulli", "Dropout"}


def fold_constants(model):
    """The simplifier used when onnxsim crashes: onnx's shape inference with data propagation,
    then every node whose inputs are all constants (or a Shape/Size of a static tensor) evaluated
    by onnx's reference evaluator into an initializer, until nothing changes; dead nodes and
    initializers dropped. Subgraphs are left as they are."""
    import numpy as np
    import onnx
    from onnx import numpy_helper
    outputs = {o.name for o in model.graph.output}
    topological_sort(model.graph)
    while True:
        model = onnx.shape_inference.infer_shapes(model, data_prop=True)
        graph = model.graph
        consts = _constant_values(graph)
        shapes = {vi.name: _dims(vi) for vi in list(graph.input) + list(graph.value_info)}
        kept, folded = [], {}
        for node in graph.node:
            ins = [i for i in node.input if i]
            static = shapes.get(node.input[0]) if node.input else None
            if node.op_type in ("Shape", "Size") and static and all(isinstance(d, int) for d in static) \
                    and not any(o in outputs for o in node.output):
                start, end = (_attrs(node).get("start", 0), _attrs(node).get("end", None))
                value = (np.array(static[start:end], np.int64) if node.op_type == "Shape"
                         else np.array(int(np.prod(static)), np.int64))
                folded[node.output[0]] = value
                consts[node.output[0]] = value
                continue
            foldable = (node.domain in ("", "ai.onnx") and node.op_type not in NONDETERMINISTIC
                        and all(i in consts for i in ins) and node.op_type != "Constant"
                        and not any(a.HasField("g") or a.graphs for a in node.attribute)
                        and not any(o in outputs for o in node.output))
            if not foldable:
                kept.append(node)
                continue
            feeds = {i: consts[i] for i in ins}
            values = _evaluate_node(model.opset_import, node, feeds)
            for name, value in zip(node.output, values):
                folded[name] = consts[name] = np.asarray(value)
        # Constant nodes become initializers too
        for node in list(kept):
            if node.op_type == "Constant" and node.output[0] in consts:
                folded[node.output[0]] = consts[node.output[0]]
                kept.remove(node)
        used = {i for n in kept for i in n.input} | outputs | _outer_names(graph)
        live, changed = [], bool(folded)
        for node in reversed(kept):  # drop nodes nothing reads
            if any(o in used for o in node.output) or not node.output:
                live.append(node)
                used |= set(node.input)
            else:
                changed = True
        del graph.node[:]
        graph.node.extend(reversed(live))
        inits = [t for t in graph.initializer if t.name in used]
        inits += [numpy_helper.from_array(v, n) for n, v in folded.items() if n in used]
        del graph.initializer[:]
        graph.initializer.extend(inits)
        del graph.value_info[:]
        if not changed:
            return onnx.shape_inference.infer_shapes(model, data_prop=True)


def topological_sort(graph) -> None:
    """Order the nodes so that each comes after the producers of what it reads, the outer names
    its subgraphs read included (onnxsim and onnx.checker reject an If placed before a node
    whose output its branch reads: "... is not output of any previous nodes"); otherwise the
    order stays as it was."""
    available = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {""}
    pending = list(graph.node)
    needs = [set(n.input) | _outer_names_of(n) for n in pending]
    order = []
    while pending:
        for k, node in enumerate(pending):
            if needs[k] <= available | {o for o in node.output}:
                break
        else:  # a cycle, or a name nothing makes: leave the rest as it is for the checker to say
            order.extend(pending)
            break
        order.append(pending.pop(k))
        needs.pop(k)
        available |= set(node.output)
    del graph.node[:]
    graph.node.extend(order)


def _outer_names_of(node) -> set[str]:
    from onnx import helper
    holder = helper.make_graph([node], "holder", [], [])
    return _outer_names(holder)


def _evaluate_node(opset_import, node, feeds: dict) -> list:
    """The outputs of one node on constant inputs (onnx's reference evaluator)."""
    from onnx import helper, numpy_helper
    from onnx.reference import ReferenceEvaluator
    graph = helper.make_graph([node], "fold", [],
                              [helper.make_tensor_value_info(o, 0, None) for o in node.output if o],
                              initializer=[numpy_helper.from_array(v, n) for n, v in feeds.items()])
    return ReferenceEvaluator(helper.make_model(graph, opset_imports=opset_import)).run(None, {})
