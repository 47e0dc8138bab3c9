"""Folding to a fixed point: the static stage's `before` phase.

Binding the inputs, shape inference, constant folding and the graph rewrites feed each other: a
`Shape -> Gather -> Equal` chain is a constant only once shapes are inferred, the `If` it decides
folds only once it is, the branch inlined brings its own `If`s and `Loop`s, a Loop's trip count
comes from a shape, and the unrolled Loop leaves sequences to fold. So each pass infers shapes
(data propagation on), folds every node whose inputs are known (constants, inputs the spec binds
to one value, Shape/Size of static tensors) into initializers, applies the phase's rewrites,
drops dead nodes; passes repeat until one changes nothing. `facts.passes` records each pass for
static.json.

Then, when dims are still dynamic, `left_control_flow` says which If/Loop is why and what its
condition or trip count depends on (data at run time), rather than a list of unknown shapes.
"""
from __future__ import annotations

from .graph_edit import (Facts, _constant_values, _dims, _evaluate_node, _outer_names_of,
                         constant_of, topological_sort)

MAX_PASSES = 32
FOLD_MAX_ELEMENTS = 1 << 16   # a folded value may have this many elements, or as many as its inputs
NONDETERMINISTIC = {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike",
                    "Multinomial", "Bernoulli", "Dropout"}
QUANTIZATION = {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"}
# ops whose outputs are sequences or optionals: never initializers (fold-sequences takes them)
NOT_TENSORS = {"SequenceEmpty", "SequenceConstruct", "SequenceInsert", "SequenceErase",
               "SplitToSequence", "Optional", "OptionalGetElement", "OptionalHasElement"}


def to_fixed_point(model, facts: Facts, rules) -> dict:
    """Pass after pass (see the module docstring) until a pass changes nothing, at most
    MAX_PASSES; {rule name: the nodes it touched, over all passes}. Each pass appends to
    `facts.passes`: folded values, rewrites applied (count per rule), nodes removed, and how
    many tensors still have a dynamic or unknown shape after its shape inference."""
    for name in facts.constants:
        facts.origins.setdefault(name, {f"{name} bound by the spec"})
    touched: dict = {}
    topological_sort(model.graph)
    for k in range(1, MAX_PASSES + 1):
        record = {"pass": k}
        problem = infer(model)
        if problem:
            record["shape_inference"] = problem
        facts.shapes = shapes_of(model)
        record["dynamic"] = len(dynamic_tensors(model))
        record["folded"] = fold_values(model, facts)
        rewritten = {}
        for rw in rules:
            done = rw.apply(model, facts)
            if done:
                touched.setdefault(rw.name, []).extend(done)
                rewritten[rw.name] = len(done)
        if rewritten:
            record["rewrites"] = rewritten
        record["removed"] = remove_dead(model.graph)
        topological_sort(model.graph)
        facts.passes.append(record)
        if not (record["folded"] or rewritten or record["removed"]):
            break  # this pass's shapes and values are those of the model as it stays
    return touched


def infer(model) -> str | None:
    """onnx shape inference with data propagation, written into the model in place (value_info
    and graph outputs; stale shapes dropped first: a folded If may change an output's rank).
    Returns the inference error's first line when it fails (the model keeps no shapes then)."""
    import onnx  # onnx: 1.5 s, not needed by doit list
    del model.graph.value_info[:]
    for out in model.graph.output:
        if out.type.HasField("tensor_type"):
            out.type.tensor_type.ClearField("shape")
    try:
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError) as exc:
        return " ".join(str(exc).split())[:300]
    model.graph.value_info.extend(inferred.graph.value_info)
    for out, new in zip(model.graph.output, inferred.graph.output):
        out.CopyFrom(new)
    return None


def shapes_of(model) -> dict:
    return {vi.name: _dims(vi) for vi in list(model.graph.input) + list(model.graph.value_info)
            + list(model.graph.output)}


def dynamic_tensors(model) -> list[str]:
    """Names (with dims) of graph tensors whose shape is unknown or not fully static."""
    bad = []
    seen = set()
    for vi in list(model.graph.input) + list(model.graph.value_info) + list(model.graph.output):
        seen.add(vi.name)
        if not vi.type.HasField("tensor_type"):
            continue
        dims = _dims(vi)
        if dims is None:
            bad.append(f"{vi.name} (unknown shape)")
        elif any(not isinstance(d, int) for d in dims):
            bad.append(f"{vi.name} {dims}")
    produced = {o for n in model.graph.node for o in n.output if o}
    inits = {t.name for t in model.graph.initializer}
    for name in sorted(produced - seen - inits):
        bad.append(f"{name} (no shape inferred)")
    return bad


# ----------------------------------------------------------------------------- values
def fold_values(model, facts: Facts, max_elements: int | None = FOLD_MAX_ELEMENTS) -> int:
    """Replace every node whose value is known by initializers: its inputs all constants or
    inputs the spec binds, or a Shape/Size of a tensor with static dims (nodes with subgraphs
    are the rewrites' to fold; Quantize/DequantizeLinear stay for onnxsim to decide). A graph output keeps its name through an Identity. Values larger than
    `max_elements` and than their inputs stay nodes (a folded Expand must not bloat the model;
    onnxsim decides about those). `facts.origins` says where each folded value came from.
    Returns how many nodes were folded."""
    from onnx import helper, numpy_helper  # onnx: 1.5 s, not needed by doit list
    graph = model.graph
    known = {**_constant_values(graph), **facts.constants}
    outputs = {o.name for o in graph.output}
    kept, inits, count = [], [], 0
    for node in graph.node:
        values = _fold(node, known, facts, model.opset_import, outputs, max_elements)
        if values is None:
            kept.append(node)
            continue
        count += 1
        origin = set().union(*(facts.origins.get(i, set()) for i in node.input if i))
        if node.op_type in ("Shape", "Size") and node.input[0] not in known:
            origin = origin | {f"the shape of {node.input[0]}"}
        for name, value in values.items():
            known[name], facts.origins[name] = value, origin
            if name in outputs:  # the output keeps its name, now an Identity of the value
                inits.append(numpy_helper.from_array(value, f"{name}__folded"))
                kept.append(helper.make_node("Identity", [f"{name}__folded"], [name],
                                             name=f"{name}__folded_out"))
            else:
                inits.append(numpy_helper.from_array(value, name))
    if count:
        del graph.node[:]
        graph.node.extend(kept)
        graph.initializer.extend(inits)
    return count


def _fold(node, known: dict, facts: Facts, opset_import, outputs: set, max_elements):
    """{output name: value} of a node whose value is known, or None."""
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    if (node.domain not in ("", "ai.onnx") or node.op_type in NONDETERMINISTIC | NOT_TENSORS
            or node.op_type == "Constant" or all(o in known for o in node.output if o)):
        return None
    if max_elements is not None and node.op_type in QUANTIZATION:
        return None  # int8 weights stay int8 with their DequantizeLinear: not a shape computation
    if node.op_type == "Identity" and node.output[0] in outputs:
        return None  # what a folded graph output is made of
    dims = facts.shapes.get(node.input[0]) if node.op_type in ("Shape", "Size") else None
    if dims is not None and all(isinstance(d, int) for d in dims):
        start, end = (_attr(node, "start", 0), _attr(node, "end", None))
        return {node.output[0]: np.array(dims[start:end], np.int64) if node.op_type == "Shape"
                else np.array(int(np.prod(dims)), np.int64)}
    if any(a.HasField("g") or a.graphs for a in node.attribute):
        return None  # If: fold-constant-if; Loop: unroll-loop, then its values fold (onnx's
        # reference Loop stacks scan outputs with vstack: [N, T] rows come out [M*N, T])
    reads = {i for i in node.input if i}
    if not all(i in known for i in reads):
        return None
    try:
        values = _evaluate_node(opset_import, node, {i: known[i] for i in reads})
    except Exception:  # onnx's reference evaluator lacks the op, or this case of it: left as is
        return None
    if not all(isinstance(v, np.ndarray) for v in values):
        return None
    size = sum(np.asarray(v).size for v in values)
    if max_elements is not None and size > max(max_elements, sum(known[i].size for i in reads)):
        return None
    return {o: np.asarray(v) for o, v in zip(node.output, values) if o}


def _attr(node, name: str, default):
    from onnx import helper  # onnx: 1.5 s, not needed by doit list
    return next((helper.get_attribute_value(a) for a in node.attribute if a.name == name), default)


def constants_as_initializers(graph) -> int:
    """Constant nodes as initializers (the second simplifier's output has no Constant left)."""
    from onnx import numpy_helper  # onnx: 1.5 s, not needed by doit list
    outputs = {o.name for o in graph.output}
    kept, count = [], 0
    for node in graph.node:
        value = constant_of(node)
        if value is None or node.output[0] in outputs:
            kept.append(node)
            continue
        graph.initializer.append(numpy_helper.from_array(value, node.output[0]))
        count += 1
    if count:
        del graph.node[:]
        graph.node.extend(kept)
    return count


def remove_dead(graph) -> int:
    """Drop the nodes nothing reads (graph outputs and subgraphs' outer reads count) and the
    initializers nothing reads; returns how many nodes went."""
    used = {o.name for o in graph.output}
    live = []
    for node in reversed(graph.node):
        if any(o in used for o in node.output if o):
            live.append(node)
            used |= set(node.input) | _outer_names_of(node)
    removed = len(graph.node) - len(live)
    if removed:
        del graph.node[:]
        graph.node.extend(reversed(live))
    inits = [t for t in graph.initializer if t.name in used]
    if len(inits) != len(graph.initializer):
        del graph.initializer[:]
        graph.initializer.extend(inits)
    return removed


# ----------------------------------------------------------------------------- what is left
def left_control_flow(model, facts: Facts, dynamic: list[str]) -> list[str]:
    """Why each If/Loop left in the graph with an output of no static shape could not be
    folded: what its condition or trip count depends on (the values of which inputs, through
    which ops), or why unrolling declined it. Empty when no such node is left."""
    graph = model.graph
    bad = {d.split(" ")[0] for d in dynamic}
    producer = {o: n for n in graph.node for o in n.output if o}
    declined = {d["node"]: d["why"] for d in facts.declined if d.get("rule") == "unroll-loop"}
    constants = set(_constant_values(graph)) | set(facts.constants)
    found = []
    for node in graph.node:
        if node.op_type not in ("If", "Loop", "Scan") or not any(o in bad for o in node.output):
            continue
        name = node.name or node.output[0]
        outs = [o for o in node.output if o in bad]
        after = f"its output{'s' if len(outs) > 1 else ''} {', '.join(outs)} " \
                f"{'have' if len(outs) > 1 else 'has'} no static shape"
        if node.op_type == "If":
            why = f"its condition {node.input[0]!r} {_depends(node.input[0], producer, graph, facts)}"
        elif node.op_type == "Loop":
            m, cond = (list(node.input) + ["", ""])[:2]
            why = "; ".join(f"its {what} {n!r} {_depends(n, producer, graph, facts)}"
                            for what, n in (("trip count", m), ("condition", cond))
                            if n and n not in constants)
            why = why or declined.get(name) or declined.get(node.output[0]) or "not unrolled"
        else:
            why = "Scan is not unrolled"
        found.append(f"{node.op_type} {name!r}: {why}; {after}")
    return found


def _depends(name: str, producer: dict, graph, facts: Facts) -> str:
    """'depends on data at run time (the values of input x, through ReduceSum, Greater)'."""
    inputs = {i.name for i in graph.input}
    todo, seen, leaves, ops = [name], set(), set(), []
    while todo:
        n = todo.pop()
        if not n or n in seen:
            continue
        seen.add(n)
        if n in inputs and n not in facts.constants:
            leaves.add(n)
        node = producer.get(n)
        if node is not None:
            if node.op_type not in ops and node.op_type != "Constant":
                ops.append(node.op_type)
            todo.extend(node.input)
    chain = ", ".join(reversed(ops[:4]))  # the ops closest to the condition, in data order
    if not leaves:
        return f"is not a constant after folding (it comes from {chain or 'outside this graph'})"
    via = f", through {chain}" if chain else ""
    return (f"depends on data at run time (the values of input{'s' if len(leaves) > 1 else ''} "
            f"{', '.join(sorted(leaves))}{via})")
