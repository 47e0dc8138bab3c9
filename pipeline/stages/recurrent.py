"""`unroll-recurrent`: LSTM and GRU over a static sequence as MatMul/Sigmoid/Tanh per step, where a
compiler of ours lacks the op. Registered in pipeline/stages/rewrites.py."""
from __future__ import annotations

from .graph_edit import Facts, NoRewrite, _Builder, _attrs, _replace, _resolve, _text

MAX_UNROLLED_STEPS = 1024   # time steps x directions of one recurrent op unrolled, at most


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
