"""`doit profile`'s view of the static model: its ONNX graph (nodes, the tensors between them,
their types), named so that every node has a name, and each op's category (`rank`: the heavy op
a fused kernel is built around; `conv_category`: depthwise / pointwise / dense / grouped).
"""
from __future__ import annotations

from dataclasses import dataclass, field


FLOAT_TYPES = (1, 10, 11, 16)  # onnx TensorProto FLOAT, FLOAT16, DOUBLE, BFLOAT16
# An entry's main node is the first of its nodes of the lowest rank: the heavy op a fused
# kernel is built around, not the activation fused after it.
HEAVY = {"Conv", "ConvTranspose", "MatMul", "Gemm", "Einsum", "LSTM", "GRU", "RNN", "Attention"}
ELEMENTWISE = {"Add", "Sub", "Mul", "Div", "Relu", "Clip", "Sigmoid", "HardSigmoid", "HardSwish",
               "Erf", "PRelu", "LeakyRelu", "Tanh", "Exp", "Log", "Sqrt", "Pow", "Neg", "Abs",
               "Max", "Min", "Where", "Cast", "Identity", "Not", "Equal", "Less", "Greater",
               "QuantizeLinear", "DequantizeLinear", "Elu", "Selu", "Softplus", "Gelu", "Floor",
               "Ceil", "Round", "Reciprocal", "BatchNormalization", "Dropout"}


@dataclass(frozen=True)
class Node:
    name: str
    op: str
    index: int                          # position among the graph's nodes (Constant left out)
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    category: str                       # the op kind its time is counted under


@dataclass
class Graph:
    """The static model's computing nodes in graph order (Constant nodes are weights)."""
    nodes: list[Node]
    shapes: dict[str, tuple] = field(default_factory=dict)  # tensor -> static shape
    types: dict[str, int] = field(default_factory=dict)     # tensor -> ONNX element type

    def __post_init__(self):
        self.by_name = {n.name: n for n in self.nodes}
        self.producer = {t: n for n in self.nodes for t in n.outputs}

    def known(self, name: str) -> str | None:
        """The graph node `name` stands for: itself, or for a node a graph rewrite put in its
        place (`<node>__<part>`, pipeline/rewrite/abi_rewrites.py) the node it replaced."""
        while name not in self.by_name and "__" in name:
            name = name.rsplit("__", 1)[0]
        return name if name in self.by_name else None

    def ordered(self, names) -> list[str]:
        """Known node names (see `known`), once each, in graph order."""
        found = {self.known(n) for n in names} - {None}
        return sorted(found, key=lambda n: self.by_name[n].index)

    def main(self, names, heavy: bool = True) -> Node | None:
        """The node an entry's time counts under: the first of the lowest rank (heavy=False:
        a kernel that is no convolution or matmul, its bias or activation aside)."""
        nodes = [self.by_name[n] for n in self.ordered(names)]
        if not heavy:
            nodes = [n for n in nodes if n.op not in HEAVY] or nodes
        return min(nodes, key=lambda n: (rank(n.op), n.index), default=None)

    def category(self, names, otherwise: str, heavy: bool = True) -> str:
        node = self.main(names, heavy)
        return node.category if node else otherwise

    def between(self, outputs, inputs, limit: int = 16) -> list[str]:
        """The nodes that compute tensors `outputs` from tensors `inputs`: the outputs'
        producers and their ancestors, up to `inputs` (and weights, model inputs). A walk that
        does not end within `limit` nodes (an input not known) gives the producers only."""
        stop = set(inputs)
        todo = [self.producer[t] for t in outputs if t in self.producer]
        seen: set[str] = set()
        while todo and len(seen) <= limit:
            node = todo.pop()
            if node.name not in seen:
                seen.add(node.name)
                todo += [self.producer[i] for i in node.inputs if i not in stop and i in self.producer]
        if len(seen) > limit:
            seen = {self.producer[t].name for t in outputs if t in self.producer}
        return self.ordered(seen)


def rank(op: str) -> int:
    return 0 if op in HEAVY else 2 if op in ELEMENTWISE else 1


def conv_category(group: int, weight_shape, in_channels) -> str:
    """Conv depthwise (one filter per input channel), grouped, pointwise (1x1) or dense."""
    if group > 1:
        return "Conv depthwise" if in_channels in (group, None) and (
            not weight_shape or weight_shape[1] == 1) else "Conv grouped"
    kernel = list(weight_shape[2:]) if weight_shape else []
    return "Conv pointwise" if kernel and all(k == 1 for k in kernel) else "Conv dense"


def named(model) -> None:
    """Give every unnamed node a name (`<op>#<index>`): the names carry the mapping."""
    taken = {n.name for n in model.graph.node}
    for k, node in enumerate(model.graph.node):
        if not node.name:
            name = f"{node.op_type}#{k}"
            while name in taken:
                name += "_"
            node.name = name
            taken.add(name)


def load_graph(model) -> Graph:
    """The Graph of an ONNX model proto (named: see `named`), static shapes inferred."""
    import onnx  # onnx: 1.5 s, not needed by doit list
    inferred = onnx.shape_inference.infer_shapes(model)
    shapes, types = {}, {}
    for vi in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]:
        if vi.type.HasField("tensor_type"):
            types[vi.name] = vi.type.tensor_type.elem_type
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape"):
            dims = [d.dim_value if d.HasField("dim_value") else None
                    for d in vi.type.tensor_type.shape.dim]
            if None not in dims:
                shapes[vi.name] = tuple(dims)
    shapes.update({i.name: tuple(i.dims) for i in model.graph.initializer})
    nodes = []
    for node in model.graph.node:
        if node.op_type == "Constant":
            continue
        category = node.op_type
        if node.op_type == "Conv":
            group = next((a.i for a in node.attribute if a.name == "group"), 1)
            x = shapes.get(node.input[0])
            category = conv_category(group, shapes.get(node.input[1]), x[1] if x else None)
        nodes.append(Node(node.name, node.op_type, len(nodes), tuple(node.input),
                          tuple(o for o in node.output if o), category))
    return Graph(nodes, shapes, types)
