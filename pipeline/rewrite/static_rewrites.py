"""Graph surgery of the `static` stage: rewrites the anchors (onnxsim, shape inference) don't do.

Each rewrite is one function `(model, facts) -> [names of the nodes it replaced]`, registered in
`REWRITES` with its phase and why it exists. It changes the graph only where its pattern is
present (an empty list: nothing touched), and raises `NoRewrite` naming the op and the reason when
the pattern is there but the rewrite cannot take it. The static stage applies them in registry
order, lists each that touched something in static.json (`rewrites`: rule, nodes, why) and then
compares the rewritten model with golden in onnxruntime, as for every static model.

Phases: `inputs` runs first, on the model as imported (which of its inputs are inputs);
`before` runs on the bound model before it is simplified (onnxsim and shape inference
cannot see through what these remove: an `If` on a bound input, a Loop, com.microsoft ops), to
a fixed point with shape inference and constant folding (fold.py: what one
rewrite exposes, such as the If inside an inlined branch, the next pass takes); `after` runs
once, on the simplified model with strictly inferred, static shapes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .contrib_ops import decompose_contrib_ops
from .fold import (constants_as_initializers, fold_values, infer, remove_dead, shapes_of,
                   to_fixed_point)
from .graph_edit import (  # noqa: F401 (NoRewrite, Facts, _dims, subgraphs: the stage's and tests' names)
    Facts, NoRewrite, _attrs, _Builder, _constant_values, _dims, _replace, inline, subgraphs,
    topological_sort)
from .loops import fold_sequences, unroll_loops
from .recurrent import MAX_UNROLLED_STEPS, unroll_recurrent  # noqa: F401


@dataclass(frozen=True)
class Rewrite:
    name: str
    phase: str                       # "inputs", or "before" or "after" simplification
    apply: Callable                  # (model, facts) -> names of the nodes replaced
    why: str


# ----------------------------------------------------------------------------- inputs
def initializer_inputs_as_constants(model, facts: Facts) -> list[str]:
    """Graph inputs that are also initializers (IR < 4 required it; old PyTorch exports list
    every weight so, BatchNorm's `num_batches_tracked` included): an initializer is then the
    input's default, which a caller may override. One the spec does not declare is a constant:
    the graph input goes, the initializer stays (else folding, or onnxsim, drops an initializer
    nothing reads and leaves a graph input onnxruntime requires). One the spec declares in
    `inputs:` stays an input, and its default goes (the spec's data, as golden fed it, is
    what it holds). An IR 3 model becomes IR 4 (where initializers need not be inputs).
    Returns one line per input it changed."""
    graph = model.graph
    inits = {t.name for t in graph.initializer}
    kept, touched, defaults = [], [], set()
    for vi in graph.input:
        if vi.name not in inits:
            kept.append(vi)
        elif vi.name in facts.inputs:
            kept.append(vi)
            defaults.add(vi.name)
            touched.append(f"{vi.name} (an input: the spec declares it; its initializer dropped)")
        else:
            touched.append(f"{vi.name} (a constant: its initializer)")
    if touched:
        del graph.input[:]
        graph.input.extend(kept)
        if model.ir_version < 4:  # before IR 4 every initializer must be a graph input
            touched.append(f"IR version {model.ir_version} -> 4 (initializers that are not "
                           f"inputs: IR 4's form, read by shape inference)")
            model.ir_version = 4
    if defaults:
        keep = [t for t in graph.initializer if t.name not in defaults]
        del graph.initializer[:]
        graph.initializer.extend(keep)
    return touched


# ----------------------------------------------------------------------------- fold If / Where
def fold_constant_branches(model, facts: Facts) -> list[str]:
    """An `If` (or `Where`) whose condition is computed only from constants, from inputs the spec
    binds to one value and from static shapes: the If is replaced by the nodes of the branch
    taken, the Where by the operand picked. A folded input stays a graph input, now unread.

    In the fixed point (fold.to_fixed_point) the condition is usually an initializer already
    (folded, with its origin in `facts.origins`); on its own this walks back to the known
    values, a `Shape`/`Size` of a tensor with static dims in `facts.shapes` counting as one."""
    graph = model.graph
    producer = {o: n for n in graph.node for o in n.output}
    known = {**_constant_values(graph), **facts.constants}
    replacements, touched = {}, []
    for k, node in enumerate(graph.node):
        if node.op_type not in ("If", "Where"):
            continue
        found = _condition(model, node.input[0], producer, known, facts)
        if found is None:
            continue
        value, origin = found
        if node.op_type == "Where":
            if value.size == 0 or not (value.all() or not value.any()):
                continue
            pick, other = node.input[1:] if value.all() else node.input[:0:-1]
            b = _Builder(graph, node.name or node.output[0])  # the shape Where broadcasts to
            wide = b.op("Expand", [pick, b.op("Shape", [node.input[0]])])
            b.op("Expand", [wide, b.op("Shape", [other])], out=[node.output[0]])
            replacements[k] = b.nodes
            taken = "X" if value.all() else "Y"
        else:
            if value.size != 1:
                continue
            taken = "then" if bool(value.reshape(-1)[0]) else "else"
            replacements[k] = _inline(graph, node, _attrs(node)[f"{taken}_branch"])
        touched.append(f"{node.name or node.output[0]} ({node.op_type}: {taken} taken, "
                       f"{', '.join(sorted(origin)) or 'a constant condition'})")
    _replace(graph, replacements)
    return touched


def _condition(model, cond: str, producer: dict, known: dict, facts: Facts):
    """(value, origin) of a condition computed from known values only, or None. The origin
    names the bound inputs and the shapes it came from (empty: constants only)."""
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    needed, todo, leaves, origin = [], [cond], {}, set()
    seen = set()
    while todo:  # the nodes the condition depends on, back to known values
        name = todo.pop()
        if not name or name in seen:
            continue
        seen.add(name)
        if name in known:
            leaves[name] = known[name]
            origin |= facts.origins.get(name, set()) | (
                {f"{name} bound by the spec"} if name in facts.constants else set())
            continue
        prod = producer.get(name)
        if prod is None or any(a.HasField("g") or a.graphs for a in prod.attribute):
            return None
        dims = facts.shapes.get(prod.input[0]) if prod.op_type in ("Shape", "Size") else None
        if dims is not None and all(isinstance(d, int) for d in dims):
            a = _attrs(prod)
            leaves[name] = (np.array(dims[a.get("start", 0):a.get("end")], np.int64)
                            if prod.op_type == "Shape" else np.array(int(np.prod(dims)), np.int64))
            origin.add(f"the shape of {prod.input[0]}")
            continue
        needed.append(prod)
        todo.extend(prod.input)
    ids = {id(n) for n in needed}
    order = [n for n in model.graph.node if id(n) in ids]
    try:
        value = leaves[cond] if not order else _evaluate(model.opset_import, order, cond, leaves)
    except Exception:  # onnx's reference evaluator lacks an op of the chain: the If stays
        return None
    return np.asarray(value), origin


def _evaluate(opset_import, nodes, output: str, feeds: dict):
    """The value of `output` computed by `nodes` from constant `feeds` (onnx's reference
    evaluator)."""
    from onnx import helper, numpy_helper  # onnx: 1.5 s, not needed by doit list
    from onnx.reference import ReferenceEvaluator  # onnx: 2.0 s, not needed by doit list
    graph = helper.make_graph(nodes, "condition", [], [helper.make_tensor_value_info(output, 0, None)],
                              initializer=[numpy_helper.from_array(v, n) for n, v in feeds.items()])
    return ReferenceEvaluator(helper.make_model(graph, opset_imports=opset_import)).run(None, {})[0]


def _inline(graph, node, branch) -> list:
    """The branch's nodes in the outer graph: its initializers become outer initializers (a copy
    of an outer one reads that one), every name it defines gets a prefix (outer names keep
    theirs), its outputs become the If's."""
    from onnx import helper  # onnx: 1.5 s, not needed by doit list
    prefix = f"{node.name or node.output[0]}__inl__"
    results = {}
    for o, out in zip(branch.output, node.output):
        results.setdefault(o.name, out)
    outer = {t.name: t for t in graph.initializer}  # copies static.localize_subgraphs made
    shared = {t.name: t.name for t in branch.initializer if outer.get(t.name) == t}
    nodes, inits, rename = inline(branch, prefix, bound=shared, results=results)
    graph.initializer.extend(inits)
    for o, out in zip(branch.output, node.output):  # an outer name, or a value given twice
        if out and rename.get(o.name, o.name) != out:
            nodes.append(helper.make_node("Identity", [rename.get(o.name, o.name)], [out],
                                          name=prefix + "out_" + out))
    return nodes


# ----------------------------------------------------------------------------- reflect Pad
def _reflect_indices(size: int, before: int, after: int):
    import numpy as np  # numpy: 0.2 s, not needed by doit list
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
    from onnx import helper, numpy_helper  # onnx: 1.5 s, not needed by doit list
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
    Rewrite("initializer-inputs-as-constants", "inputs", initializer_inputs_as_constants,
            "graph inputs that are also initializers have a default the caller may override; "
            "those the spec does not declare are constants (weights, BatchNorm's "
            "num_batches_tracked), those it declares are inputs"),
    Rewrite("fold-constant-if", "before", fold_constant_branches,
            "the condition is fixed once the spec binds the inputs (their shapes, and the values "
            "of those it binds to one value): the other branch is dead code, and an If left in "
            "has the shapes of both branches (dynamic where they differ); the artifact is "
            "specialised to those inputs"),
    Rewrite("decompose-contrib-ops", "before", decompose_contrib_ops,
            "onnxruntime's com.microsoft ops are accepted by neither IREE nor TVM"),
    Rewrite("unroll-loop", "before", unroll_loops,
            "the trip count and condition are fixed once the spec binds the inputs; neither IREE "
            "nor TVM takes a Loop, and its scan outputs have a dynamic length until unrolled"),
    Rewrite("fold-sequences", "before", fold_sequences,
            "a sequence built by SequenceInsert/SequenceConstruct (a TensorArray, often "
            "unrolled from a Loop) has a known length: its readers become Concat/Identity; "
            "no compiler of ours takes sequences"),
    Rewrite("reflect-pad-as-gather", "after", _reflect_pads,
            "IREE 3.13 llvm-cpu fails to compile reflect Pad of this size; Gather with constant "
            "indices copies the same elements"),
    Rewrite("unroll-recurrent", "after", unroll_recurrent,
            "a compiler of ours lacks the op (see `lacking`); over a static sequence it is "
            "MatMul/Sigmoid/Tanh per step"),
)


def apply(model, phase: str, facts: Facts) -> list[dict]:
    """Apply the phase's rewrites in order; the records of those that touched something.

    The `before` phase runs to a fixed point (fold.to_fixed_point): shape inference, values
    folded, then its rewrites, pass after pass until none changes the graph; `facts.passes`
    says what each pass did. `after` runs each rewrite once."""
    rules = [rw for rw in REWRITES if rw.phase == phase]
    if phase == "before":
        touched = to_fixed_point(model, facts, rules)
    else:
        touched = {rw.name: rw.apply(model, facts) for rw in rules}
    records = []
    for rw in rules:
        if touched.get(rw.name):
            why = rw.why
            if rw.name == "unroll-recurrent":
                ops = sorted({t.split("(")[1].split(",")[0] for t in touched[rw.name]})
                why = "; ".join(f"{op}: {facts.lacking[op]}" for op in ops) + \
                    "; unrolled over the static sequence into MatMul/Sigmoid/Tanh"
            records.append({"rule": rw.name, "nodes": touched[rw.name], "why": why})
    return records


# ----------------------------------------------------------------------------- second simplifier
def fold_constants(model):
    """The simplifier used when onnxsim crashes: onnx's shape inference with data propagation,
    then every node whose inputs are all constants (or a Shape/Size of a static tensor) evaluated
    by onnx's reference evaluator into an initializer, Constant nodes made initializers, until
    nothing changes; dead nodes and initializers dropped. Subgraphs are left as they are."""
    import onnx  # onnx: 1.5 s, not needed by doit list
    topological_sort(model.graph)
    facts = Facts()
    while True:
        infer(model)
        facts.shapes = shapes_of(model)
        changed = fold_values(model, facts, max_elements=None) + constants_as_initializers(model.graph)
        changed += remove_dead(model.graph)
        del model.graph.value_info[:]
        if not changed:
            return onnx.shape_inference.infer_shapes(model, data_prop=True)
