"""`unroll-loop` and `fold-sequences`: a Loop whose trip count and condition are known once the
inputs are bound, as its body repeated; a sequence of known length, as the tensors it holds.
Neither IREE nor TVM takes Loop or sequences, and a Loop's scan outputs have no static length
until its trip count is known. Registered in static_rewrites.py (phase `before`, which
fold.to_fixed_point runs until nothing changes: what one unrolled iteration makes constant,
the next pass folds)."""
from __future__ import annotations

from .fold import NONDETERMINISTIC, NOT_TENSORS
from .graph_edit import (Facts, _attrs, _Builder, _constant_values, _evaluate_node,
                         _outer_names_of, _replace, inline)

MAX_ITERATIONS = 1024          # iterations of one Loop unrolled, at most
MAX_UNROLLED_NODES = 100_000   # iterations x body nodes of one Loop, at most


def unroll_loops(model, facts: Facts) -> list[str]:
    """Each Loop whose trip count `M` and condition are constants (folded from the bound inputs,
    their shapes or constants), and whose body's condition output is computable iteration by
    iteration from them: the body once per iteration (the iteration number a constant, the
    carried values threaded through), scan outputs stacked by Unsqueeze + Concat. A Loop it
    cannot unroll stays, with the reason in `facts.declined` (the stage names it if its
    outputs are left without a static shape)."""
    graph = model.graph
    known = {**_constant_values(graph), **facts.constants}
    replacements, touched = {}, []
    # this pass says anew which Loops stay (one declined before may unroll now)
    facts.declined[:] = [d for d in facts.declined if d.get("rule") != "unroll-loop"]
    for k, node in enumerate(graph.node):
        if node.op_type != "Loop" or node.domain not in ("", "ai.onnx"):
            continue
        name = node.name or node.output[0]
        plan = _unroll(graph, node, known, model.opset_import)
        if isinstance(plan, str):
            facts.declined.append({"rule": "unroll-loop", "node": name, "why": plan})
            continue
        replacements[k], count = plan
        m_name = node.input[0] if node.input else ""
        limit = int(known[m_name].reshape(-1)[0]) if m_name else None
        if limit is None or count < limit:  # the condition ended it (a while loop)
            read = {c for c in _outer_names_of(node) | {(list(node.input) + ["", ""])[1]} if c}
            origin = sorted(set().union(*(facts.origins.get(c, set()) for c in read)))
            how = "until its condition turned false" + (f" ({', '.join(origin)})" if origin else "") \
                + (f", before its trip count {limit}" if limit is not None else "")
        else:
            how = ", ".join(sorted(facts.origins.get(m_name, set()))) or "a constant trip count"
        touched.append(f"{name} (Loop: {count} iteration{'' if count == 1 else 's'}, {how})")
    _replace(graph, replacements)
    return touched


def _unroll(graph, node, known: dict, opset_import):
    """(nodes replacing the Loop, iterations) or why it cannot be unrolled."""
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    from onnx import numpy_helper  # onnx: 1.5 s, not needed by doit list
    body = _attrs(node)["body"]
    ins = list(node.input) + [""] * max(0, 2 - len(node.input))
    m_name, c_name, initial = ins[0], ins[1], ins[2:]
    n_carried = len(initial)
    if m_name and m_name not in known:
        return f"its trip count {m_name!r} depends on data at run time"
    if c_name and c_name not in known:
        return f"its condition {c_name!r} depends on data at run time"
    limit = int(np.asarray(known[m_name]).reshape(-1)[0]) if m_name else None
    go = bool(np.asarray(known[c_name]).reshape(-1)[0]) if c_name else True
    if go and limit is not None and (limit > MAX_ITERATIONS
                                     or limit * len(body.node) > MAX_UNROLLED_NODES):
        if _passes_condition_on(body):  # a for loop: the trip count is all there is
            return (f"its trip count {limit} asks for {limit} iterations of {len(body.node)} "
                    f"nodes; at most {MAX_ITERATIONS} iterations and {MAX_UNROLLED_NODES} nodes "
                    f"are unrolled")
        # a while loop with a bound (tf.map_fn/while_loop: M = 2^63 - 1, `i < n` in the body):
        # the iterations are those until the body's condition turns false, if it does in time
    stem = node.name or node.output[0]
    b = _Builder(graph, stem)
    inits = _shared_initializers(graph, body, f"{stem}__body__")
    for t in body.initializer:  # the body's own constants count as known (`n` of `i < n`)
        known.setdefault(inits[t.name], numpy_helper.to_array(t))
    cond, carried, producer, iterations = c_name, initial, {}, []
    while go and (limit is None or len(iterations) < limit):
        i = len(iterations)
        if i >= MAX_ITERATIONS or (i + 1) * len(body.node) > MAX_UNROLLED_NODES:  # a while loop
            return (f"{'its trip count ' + str(limit) if limit is not None else 'its condition'} "
                    f"asks for more than {i} iterations of {len(body.node)} nodes; at most "
                    f"{MAX_ITERATIONS} iterations and {MAX_UNROLLED_NODES} nodes are unrolled")
        prefix = f"{stem}__it{i}__"
        known[prefix + "iter"] = np.array(i, np.int64)
        if not cond:
            known[cond := f"{stem}__cond"] = np.array(True)
        bound = {**inits, body.input[0].name: prefix + "iter", body.input[1].name: cond,
                 **{v.name: c for v, c in zip(body.input[2:], carried)}}
        nodes, _, rename = inline(body, prefix, bound=bound)
        outs = [rename.get(o.name, o.name) for o in body.output]
        producer.update({o: n for n in nodes for o in n.output if o})
        value = _value(outs[0], producer, known, opset_import)
        if value is None:
            return (f"its condition after iteration {i} ({body.output[0].name!r}) depends on "
                    f"data at run time")
        iterations.append([bound, nodes, outs])
        go, cond, carried = bool(value.reshape(-1)[0]), outs[0], outs[1:1 + n_carried]
    if not iterations and any(node.output[n_carried:]):
        return "no iteration runs, and its scan outputs would be empty tensors of unknown shape"
    return _stacked(b, graph, node, body, iterations, initial, opset_import), len(iterations)


def _passes_condition_on(body) -> bool:
    """Whether the body's condition output is its condition input passed on (through
    Identity): a for loop, which only the trip count ends."""
    cond_in, cond_out = body.input[1].name, body.output[0].name
    producer = {o: n for n in body.node for o in n.output}
    while cond_out != cond_in:
        node = producer.get(cond_out)
        if node is None or node.op_type != "Identity":
            return False
        cond_out = node.input[0]
    return True


def _stacked(b: _Builder, graph, node, body, iterations: list, initial: list, opset_import) -> list:
    """The unrolled nodes: every iteration's (the last one rebuilt to write the Loop's carried
    outputs under their names), then each scan output as the Concat of the iterations' values,
    each Unsqueezed. The body's initializers are copied once, shared by all iterations."""
    from onnx import helper  # onnx: 1.5 s, not needed by doit list
    n_carried = len(initial)
    stem = node.name or node.output[0]
    for t in body.initializer:
        if iterations and iterations[0][0][t.name] != t.name:
            copy = graph.initializer.add()
            copy.CopyFrom(t)
            copy.name = iterations[0][0][t.name]
    if iterations:
        bound = iterations[-1][0]
        results = {}
        for o, out in zip(body.output[1:1 + n_carried], node.output[:n_carried]):
            if out:
                results.setdefault(o.name, out)
        last, _, rename = inline(body, f"{stem}__it{len(iterations) - 1}__", bound=bound,
                                 results=results)
        iterations[-1][1:] = [last, [rename.get(o.name, o.name) for o in body.output]]
    nodes = [n for _, its, _ in iterations for n in its]
    finals = iterations[-1][2][1:1 + n_carried] if iterations else initial
    for value, out in zip(finals, node.output[:n_carried]):
        if out and value != out:
            nodes.append(helper.make_node("Identity", [value], [out], name=f"{stem}__out_{out}"))
    version = next(o.version for o in opset_import if o.domain in ("", "ai.onnx"))
    for s, out in enumerate(node.output[n_carried:]):
        if out:
            rows = [_unsqueezed(b, outs[1 + n_carried + s], version) for _, _, outs in iterations]
            b.op("Concat", rows, out=[out], axis=0)
    for k in range(len(iterations)):  # the iteration numbers, as the body read them
        graph.initializer.append(_scalar(k, f"{stem}__it{k}__iter"))
    if "" in node.input[1:2] or len(node.input) < 2:
        graph.initializer.append(_scalar(True, f"{stem}__cond"))
    return nodes + b.nodes


def _shared_initializers(graph, body, prefix: str) -> dict:
    """Body initializer -> the outer name every iteration reads it under: the outer initializer
    it is a copy of (static.localize_subgraphs made it), else a copy under `prefix`."""
    outer = {t.name: t for t in graph.initializer}
    return {t.name: t.name if outer.get(t.name) == t else prefix + t.name for t in body.initializer}


def _scalar(value, name: str):
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    from onnx import numpy_helper  # onnx: 1.5 s, not needed by doit list
    return numpy_helper.from_array(np.array(value, np.bool_ if isinstance(value, bool) else np.int64),
                                   name)


def _unsqueezed(b: _Builder, name: str, version: int, axis: int = 0) -> str:
    """Unsqueeze at `axis`: axes an input from opset 13, an attribute before."""
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    if version >= 13:
        return b.op("Unsqueeze", [name, b.const(np.array([axis], np.int64), "axes")])
    return b.op("Unsqueeze", [name], axes=[axis])


def _value(name: str, producer: dict, known: dict, opset_import, depth: int = 0):
    """The value of `name` computed from known values by the nodes in `producer` (memoised in
    `known`), or None where it depends on anything else."""
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    if name in known:
        return np.asarray(known[name])
    node = producer.get(name)
    if (node is None or depth > 64 or node.domain not in ("", "ai.onnx")
            or node.op_type in NONDETERMINISTIC | NOT_TENSORS | {"Loop", "Scan"}):
        return None  # (onnx's reference Loop stacks scan outputs wrongly: see fold._fold)
    feeds = {}
    for i in {i for i in node.input if i} | _outer_names_of(node):
        feeds[i] = _value(i, producer, known, opset_import, depth + 1)
        if feeds[i] is None:
            return None
    try:
        values = _evaluate_node(opset_import, node, feeds)
    except Exception:  # onnx's reference evaluator lacks the op: not computable here
        return None
    for o, v in zip(node.output, values):
        if o and isinstance(v, np.ndarray):
            known[o] = v
    return known.get(name)


# ----------------------------------------------------------------------------- sequences
def fold_sequences(model, facts: Facts) -> list[str]:
    """A sequence whose elements are known tensors (SequenceEmpty / SequenceConstruct, a
    SplitToSequence over a static axis (as Split, made once a reader folds), then
    SequenceInsert / SequenceErase at constant positions, Identity): its readers become tensor
    ops: ConcatFromSequence -> Concat (Unsqueeze first when `new_axis`), SequenceAt -> Identity
    of the element, SequenceLength -> the constant. The sequence ops then have no reader left,
    and the fixed point drops them."""
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    graph = model.graph
    known = {**_constant_values(graph), **facts.constants}
    version = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    held: dict = {}   # sequence name -> the tensor names it holds, in order
    splits: dict = {}  # SplitToSequence's index -> (the nodes making its elements, their names)
    replacements, touched = {}, []
    for k, node in enumerate(graph.node):
        op, ins = node.op_type, list(node.input) + ["", ""]
        out = node.output[0] if node.output else ""
        seq = held.get(ins[0])
        if op == "SplitToSequence":
            planned = _split_elements(graph, node, facts.shapes.get(ins[0]), known, version)
            if planned is not None:
                splits[k] = planned
                held[out] = planned[1]
        elif op == "SequenceEmpty":
            held[out] = []
        elif op == "SequenceConstruct":
            held[out] = list(node.input)
        elif op == "Identity" and seq is not None:
            held[out] = seq
        elif op == "SequenceInsert" and seq is not None:
            at = _position(ins[2], known, len(seq), len(seq), insert=True)
            if at is not None:
                held[out] = seq[:at] + [ins[1]] + seq[at:]
        elif op == "SequenceErase" and seq is not None and seq:
            at = _position(ins[1], known, len(seq), len(seq) - 1)
            if at is not None:
                held[out] = seq[:at] + seq[at + 1:]
        elif op in ("ConcatFromSequence", "SequenceAt", "SequenceLength") and seq is not None:
            b = _Builder(graph, node.name or out)
            if op == "SequenceLength":
                b.op("Identity", [b.const(np.array(len(seq), np.int64), "length")], out=[out])
            elif op == "SequenceAt":
                at = _position(ins[1], known, len(seq), None)
                if at is None:
                    continue
                b.op("Identity", [seq[at]], out=[out])
            else:
                if not seq:
                    continue
                a = _attrs(node)
                items = [_unsqueezed(b, e, version, a["axis"]) for e in seq] if a.get("new_axis") else seq
                b.op("Concat", items, out=[out], axis=a["axis"])
            replacements[k] = b.nodes
            touched.append(f"{out} ({op} of a sequence of {len(seq)} tensors)")
            for j, (nodes, names) in splits.items():  # the elements it reads exist from now on
                if set(names) & set(seq) and j not in replacements:
                    replacements[j] = nodes + [graph.node[j]]
    _replace(graph, replacements)
    return touched


def _split_elements(graph, node, dims, known: dict, version: int):
    """(nodes, element names) of a SplitToSequence over a static axis as Split (+ Squeeze when
    `keepdims` is 0 and no `split` is given), or None (the axis or the split not known)."""
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    a = _attrs(node)
    axis = a.get("axis", 0)
    if dims is None or not -len(dims) <= axis < len(dims) or not isinstance(dims[axis % len(dims)], int):
        return None
    size = dims[axis % len(dims)]
    split = node.input[1] if len(node.input) > 1 else ""
    if split and split not in known:
        return None
    value = np.asarray(known[split]).reshape(-1) if split else None
    if value is None:
        lengths = [1] * size
    elif np.asarray(known[split]).ndim == 0:   # chunks of this length, the last one shorter
        step = int(value[0])
        lengths = [min(step, size - s) for s in range(0, size, step)] if step > 0 else []
    else:
        lengths = [int(v) for v in value]
    if not lengths or sum(lengths) != size or len(lengths) > MAX_ITERATIONS:
        return None
    b = _Builder(graph, node.name or node.output[0])
    parts = [b.name("part") for _ in lengths]
    if version >= 13:
        b.op("Split", [node.input[0], b.const(np.array(lengths, np.int64), "split")], out=parts,
             axis=axis)
    else:
        b.op("Split", [node.input[0]], out=parts, axis=axis, split=lengths)
    if split or a.get("keepdims", 1):
        return b.nodes, parts
    squeezed = [b.op("Squeeze", [p, b.const(np.array([axis], np.int64), "axes")]) if version >= 13
                else b.op("Squeeze", [p], axes=[axis]) for p in parts]
    return b.nodes, squeezed


def _position(name: str, known: dict, length: int, default, insert: bool = False):
    """A position in a sequence of `length` tensors read from `name` (a constant; negative counts
    from the back), in [0, length) or, to insert, [0, length]; `default` when `name` is empty;
    None when unknown or out of range."""
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    if not name:
        return default
    if name not in known:
        return None
    at = int(np.asarray(known[name]).reshape(-1)[0])
    at = at + length if at < 0 else at
    return at if 0 <= at < length + insert else None
