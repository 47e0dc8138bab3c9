"""What the graph rewrites share: the facts they rely on, the refusal they raise, and small
helpers to read values and replace nodes (static_rewrites.py has the static stage's registry)."""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field


def main_opset(model) -> int:
    """The model's ai.onnx opset."""
    return max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)


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
    origins: dict = field(default_factory=dict)     # folded name -> where its value came from
    passes: list = field(default_factory=list)      # what each folding pass did (static.json)
    inputs: frozenset = frozenset()                 # the input names the spec declares


# ----------------------------------------------------------------------------- helpers
def _dims(value_info) -> list:
    """The dims of a tensor's value_info: ints where known, a name or "?" where not; None when
    even the rank is unknown. A zero-length dim (an empty `roi` of Resize) is static: 0."""
    tt = value_info.type.tensor_type
    if not tt.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") and d.dim_value >= 0 else (d.dim_param or "?")
            for d in tt.shape.dim]


def subgraphs(graph):
    """The subgraphs of a graph's nodes (If branches, Loop/Scan bodies), one level down."""
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("g"):
                yield attr.g
            yield from attr.graphs


def _attrs(node) -> dict:
    from onnx import helper  # onnx: 1.5 s, not needed by doit list
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _text(value):
    return value.decode() if isinstance(value, bytes) else value


def _inits(graph) -> dict:
    from onnx import numpy_helper  # onnx: 1.5 s, not needed by doit list
    return {t.name: numpy_helper.to_array(t) for t in graph.initializer}


def _constant_values(graph) -> dict:
    """Initializers and Constant node outputs of one graph, as arrays."""
    values = _inits(graph)
    for node in graph.node:
        value = constant_of(node)
        if value is not None:
            values[node.output[0]] = value
    return values


def constant_of(node):
    """The value of a Constant node as an array (any of its value attributes but sparse ones
    and strings), or None."""
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    from onnx import helper, numpy_helper  # onnx: 1.5 s, not needed by doit list
    if node.op_type != "Constant" or len(node.attribute) != 1:
        return None
    a = node.attribute[0]
    value = helper.get_attribute_value(a)
    if a.name == "value":
        return numpy_helper.to_array(value)
    kinds = {"value_float": np.float32, "value_floats": np.float32,
             "value_int": np.int64, "value_ints": np.int64}
    return np.array(value, kinds[a.name]) if a.name in kinds else None


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
        from onnx import numpy_helper  # onnx: 1.5 s, not needed by doit list
        name = self.name(what)
        self.graph.initializer.append(numpy_helper.from_array(array, name))
        return name

    def op(self, op_type: str, inputs: list, n_out: int = 1, out: list | None = None, **attrs):
        from onnx import helper  # onnx: 1.5 s, not needed by doit list
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


def _evaluate_node(opset_import, node, feeds: dict) -> list:
    """The outputs of one node on constant inputs (onnx's reference evaluator)."""
    from onnx import helper, numpy_helper  # onnx: 1.5 s, not needed by doit list
    from onnx.reference import ReferenceEvaluator  # onnx: 2.0 s, not needed by doit list
    graph = helper.make_graph([node], "fold", [],
                              [helper.make_tensor_value_info(o, 0, None) for o in node.output if o],
                              initializer=[numpy_helper.from_array(v, n) for n, v in feeds.items()])
    return ReferenceEvaluator(helper.make_model(graph, opset_imports=opset_import)).run(None, {})


def _outer_names_of(node) -> set[str]:
    """Names a node's subgraphs read from the scope the node stands in."""
    from onnx import helper  # onnx: 1.5 s, not needed by doit list
    if not any(a.HasField("g") or a.graphs for a in node.attribute):
        return set()
    return _outer_names(helper.make_graph([node], "holder", [], []))


def inline(sub, prefix: str, bound: dict | None = None, results: dict | None = None):
    """(nodes, initializers, rename) of subgraph `sub` copied into the graph that holds it: a
    name in `bound` (an input, an initializer several copies share) reads the outer name given;
    a name its nodes or initializers define is written as `results` says, else under `prefix`;
    names it reads from outer scopes keep theirs, in nested subgraphs too (whose own names
    shadow). `rename` maps each of its names to the outer one: its outputs are
    `rename.get(o.name, o.name)`."""
    bound, results = bound or {}, results or {}
    defined = {t.name for t in sub.initializer} | {o for n in sub.node for o in n.output if o}
    rename = {name: prefix + name for name in defined | {i.name for i in sub.input}}
    rename.update({k: v for k, v in results.items() if k in defined})
    rename.update(bound)
    inits = []
    for t in sub.initializer:
        if t.name not in bound:
            copy = type(t)()
            copy.CopyFrom(t)
            copy.name = rename[t.name]
            inits.append(copy)
    nodes = []
    for n in sub.node:
        new = type(n)()
        new.CopyFrom(n)
        new.input[:] = [rename.get(i, i) for i in n.input]
        new.output[:] = [rename.get(o, o) for o in n.output]
        new.name = prefix + (n.name or n.output[0])
        for a in new.attribute:
            for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                _rename_reads(g, rename)
        nodes.append(new)
    return nodes, inits, rename


def _rename_reads(g, names: dict) -> None:
    """Rename in a nested subgraph the outer names it reads (its own names shadow them)."""
    own = ({t.name for t in g.initializer} | {i.name for i in g.input}
           | {o for n in g.node for o in n.output})
    inner = {k: v for k, v in names.items() if k not in own}
    for n in g.node:
        n.input[:] = [inner.get(i, i) for i in n.input]
        for a in n.attribute:
            for sg in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                _rename_reads(sg, inner)
    for o in g.output:
        o.name = inner.get(o.name, o.name)


def topological_sort(graph) -> None:
    """Order the nodes so that each comes after the producers of what it reads, the outer names
    its subgraphs read included (onnxsim and onnx.checker reject an If placed before a node
    whose output its branch reads: "... is not output of any previous nodes"); otherwise the
    order stays as it was (Kahn's algorithm, the earliest ready node first). Nodes in a cycle,
    or reading a name nothing makes, keep their order at the end for the checker to name."""
    nodes = list(graph.node)
    producer = {o: k for k, n in enumerate(nodes) for o in n.output if o}
    waits = [0] * len(nodes)
    readers: dict = {}
    for k, node in enumerate(nodes):
        for name in set(node.input) | _outer_names_of(node):
            p = producer.get(name)
            if p is not None and p != k:
                waits[k] += 1
                readers.setdefault(p, []).append(k)
    ready = [k for k, w in enumerate(waits) if w == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        k = heapq.heappop(ready)
        order.append(k)
        for r in readers.get(k, ()):
            waits[r] -= 1
            if waits[r] == 0:
                heapq.heappush(ready, r)
    if len(order) == len(nodes) and order == sorted(order):
        return
    placed = set(order)
    order += [k for k in range(len(nodes)) if k not in placed]
    del graph.node[:]
    graph.node.extend(nodes[k] for k in order)
