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

from dataclasses import dataclass
from typing import Callable

from .contrib_ops import decompose_contrib_ops
from .graph_edit import (  # noqa: F401 (NoRewrite, Facts, _dims, subgraphs: the stage's and tests' names)
    Facts, NoRewrite, _attrs, _Builder, _constant_values, _dims, _evaluate_node,
    _outer_names, _replace, subgraphs)
from .recurrent import MAX_UNROLLED_STEPS, unroll_recurrent  # noqa: F401


@dataclass(frozen=True)
class Rewrite:
    name: str
    phase: str                       # "before" or "after" simplification
    apply: Callable                  # (model, facts) -> names of the nodes replaced
    why: str


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
