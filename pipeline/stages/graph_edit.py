"""What the graph rewrites share: the facts they rely on, the refusal they raise, and small
helpers to read values and replace nodes (pipeline/stages/rewrites.py has the registry)."""
from __future__ import annotations

from dataclasses import dataclass, field


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


def _evaluate_node(opset_import, node, feeds: dict) -> list:
    """The outputs of one node on constant inputs (onnx's reference evaluator)."""
    from onnx import helper, numpy_helper
    from onnx.reference import ReferenceEvaluator
    graph = helper.make_graph([node], "fold", [],
                              [helper.make_tensor_value_info(o, 0, None) for o in node.output if o],
                              initializer=[numpy_helper.from_array(v, n) for n, v in feeds.items()])
    return ReferenceEvaluator(helper.make_model(graph, opset_imports=opset_import)).run(None, {})
