"""`postprocess:` of a model.yaml: where a detector's data-dependent post-processing is cut off.

A detector whose graph ends in NonMaxSuppression (or NonZero, or a TopK whose K is computed from
data) has outputs whose length depends on the input: no static artifact can return them. With
`postprocess: {cut: auto}` the pipeline builds the graph up to the last static tensors (the
boxes and scores NMS reads) as the artifact, and ships the rest as `postprocess.onnx`, run on
the host (docs/postprocess.md). The artifact's outputs are then the cut tensors: the spec's
signature says so (`outputs`), so golden, validate and release see the artifact's interface; the
model's own outputs are kept under `postprocess_outputs`. Validation also compares detections
(the post-processing run on the artifact's outputs and on golden's) as sets: boxes matched by
IoU >= `iou`, the other float columns within `score_abs`, integer columns equal.

find_cut() walks the graph: the seeds are the data-dependent ops; every node that reads what a
seed produced goes with them, and so do the shape-only helpers (Shape, Constant, arithmetic on
their values) only they read; the cut is what those nodes read from the rest of the graph.
Graph inputs read by the post-processing (an image size) stay its inputs, fed from the model's
inputs. Run once per source (memoised by its sha256 with the spec's cut).
"""
from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import Field

from .common import Doc, Says

VERSION = 1
SEEDS = ("NonMaxSuppression", "NonZero")   # always data-dependent; TopK when its K is
SHAPE_ONLY = ("Shape", "Size", "Constant", "ConstantOfShape")
DTYPES = {1: "float32", 2: "uint8", 3: "int8", 6: "int32", 7: "int64", 9: "bool", 10: "float16",
          11: "float64"}


class PostprocessDoc(Doc):
    """Cut a detector's data-dependent post-processing (NonMaxSuppression, NonZero, TopK with a
    K computed from data) off the artifact; it ships as postprocess.onnx, run on the host, and
    validation compares detections (docs/postprocess.md)."""
    cut: Union[Literal["auto"], Annotated[list[Annotated[str, Field(pattern=r"\S")]],
                                          Field(min_length=1)]] = "auto"
    """`auto`: the tensors the data-dependent ops read (found by walking back from them); or
    the tensors to cut at, by name (they become the artifact's outputs)"""
    iou: Annotated[float, Field(gt=0, le=1), Says("expected an IoU in (0, 1], got {input}")] = 0.9
    """a detection of the artifact matches one of golden's when their boxes overlap by at least
    this IoU"""
    score_abs: Annotated[float, Field(ge=0)] = 1e-3
    """... and their other float columns (scores) differ by at most this much; integer columns
    (classes) must be equal"""


def _graph_facts(model):
    """(producer of each tensor, consumers of each tensor, constant names, graph input names)."""
    producer = {o: n for n in model.graph.node for o in n.output if o}
    consumers: dict = {}
    for n in model.graph.node:
        for i in set(_reads(n)):
            consumers.setdefault(i, []).append(n)
    initializers = {t.name for t in model.graph.initializer}
    inputs = {i.name for i in model.graph.input} - initializers
    constants = initializers | {o for n in model.graph.node if n.op_type == "Constant"
                                for o in n.output}
    return producer, consumers, constants, inputs


def _reads(node) -> list[str]:
    """What a node reads, its subgraphs' outer-scope reads included."""
    names = [i for i in node.input if i]
    for a in node.attribute:
        for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
            inner = {o for n in g.node for o in n.output} | {t.name for t in g.initializer} | {
                i.name for i in g.input}
            names += [i for n in g.node for i in _reads(n) if i not in inner]
    return names


def _from_data(name: str, producer: dict, constants: set, inputs: set) -> bool:
    """Whether a tensor's value depends on the data (a graph input's values), not only on
    constants and shapes (which the spec binds)."""
    todo, seen = [name], set()
    while todo:
        t = todo.pop()
        if t in seen or t in constants:
            continue
        seen.add(t)
        if t in inputs:
            return True
        node = producer.get(t)
        if node is None or node.op_type in ("Shape", "Size"):
            continue
        if node.op_type in SEEDS:
            return True
        todo += _reads(node)
    return False


def seeds(model) -> list:
    """The data-dependent nodes: NonMaxSuppression, NonZero, a TopK whose K comes from data."""
    producer, _, constants, inputs = _graph_facts(model)
    return [n for n in model.graph.node if n.op_type in SEEDS or (
        n.op_type == "TopK" and len(n.input) > 1
        and _from_data(n.input[1], producer, constants, inputs))]


def post_nodes(model) -> list:
    """The nodes of the post-processing: the seeds, all that reads what they produce, and the
    shape-only helpers only those read (graph order)."""
    producer, consumers, constants, inputs = _graph_facts(model)
    post = set()
    todo = [id(n) for n in seeds(model)]
    by_id = {id(n): n for n in model.graph.node}
    while todo:  # downstream of the seeds
        k = todo.pop()
        if k in post:
            continue
        post.add(k)
        for o in by_id[k].output:
            todo += [id(c) for c in consumers.get(o, [])]
    outputs = {o.name for o in model.graph.output}
    changed = True
    while changed:  # nodes read only by the post nodes that would add nothing to the cut
        changed = False
        cut = {i for k in post for i in _reads(by_id[k])}
        for n in model.graph.node:
            if id(n) in post or any(o in outputs for o in n.output):
                continue
            readers = [c for o in n.output for c in consumers.get(o, [])]
            if not readers or any(id(c) not in post for c in readers):
                continue
            reads = [i for i in _reads(n) if i not in constants]
            # a helper computed from constants and shapes (Shape, Constant, arithmetic on
            # them), or a node whose data the post nodes read already (a Squeeze of the boxes)
            if n.op_type in SHAPE_ONLY or all(
                    i in cut or not _from_data(i, producer, constants, inputs) for i in reads):
                post.add(id(n))
                changed = True
    return [n for n in model.graph.node if id(n) in post]


def find_cut(model, named: list[str] | None = None) -> dict:
    """What the cut is for this model (an onnx ModelProto): {cut: [{name, dtype, dims}],
    outputs: [the model's outputs the post-processing computes], inputs: [graph inputs it reads],
    ops: {op: count} removed}; or {error: why} when there is nothing to cut or a named tensor is
    not in the graph. `named`: the spec's own cut tensors (None: auto)."""
    import onnx  # onnx: 1.5 s, not needed by doit list (only specs with postprocess come here)
    inferred = onnx.shape_inference.infer_shapes(model)
    infos = {vi.name: vi for vi in list(inferred.graph.input) + list(inferred.graph.value_info)
             + list(inferred.graph.output)}
    producer, consumers, constants, inputs = _graph_facts(model)
    outputs = [o.name for o in model.graph.output]
    if named is None:
        post = post_nodes(model)
        if not post:
            return {"error": "the graph has no data-dependent post-processing to cut (no "
                             "NonMaxSuppression, NonZero, or TopK whose K comes from data)"}
        made = {o for n in post for o in n.output}
        cut = []
        for n in post:
            for i in _reads(n):
                if i not in made and i not in constants and i not in inputs and i not in cut:
                    cut.append(i)
        cut += [o for o in outputs if o not in made and o not in cut]  # outputs left static
        reads_inputs = sorted({i for n in post for i in _reads(n) if i in inputs})
        post_outputs = [o for o in outputs if o in made]
        ops = [n.op_type for n in post]
    else:
        known = set(producer) | inputs
        missing = [t for t in named if t not in known]
        if missing:
            return {"error": f"no tensor named {', '.join(missing)} in the graph"}
        cut = list(named)
        post_outputs = [o for o in outputs if o not in cut]
        nodes, reads_inputs = between(model, cut, post_outputs, producer, inputs)
        ops = [n.op_type for n in nodes]
    shown = []
    for name in cut:
        tt = infos[name].type.tensor_type if name in infos else None
        if tt is None or not tt.elem_type:
            return {"error": f"shape inference gives no type for the cut tensor {name!r}: name "
                             f"the cut tensors in postprocess.cut"}
        dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                for d in tt.shape.dim] if tt.HasField("shape") else []
        shown.append({"name": name, "dtype": DTYPES.get(tt.elem_type, str(tt.elem_type)),
                      "dims": dims})
    counts: dict = {}
    for op in ops:
        counts[op] = counts.get(op, 0) + 1
    return {"cut": shown, "outputs": post_outputs, "inputs": reads_inputs,
            "ops": dict(sorted(counts.items()))}


def between(model, cut: list[str], outputs: list[str], producer: dict, inputs: set):
    """(the nodes that compute `outputs` from `cut`, constants and graph inputs; the graph
    inputs they read)."""
    todo, seen, found, reads = list(outputs), set(cut), [], set()
    while todo:
        t = todo.pop()
        if t in seen:
            continue
        seen.add(t)
        if t in inputs:
            reads.add(t)
        node = producer.get(t)
        if node is not None and all(id(node) != id(f) for f in found):
            found.append(node)
            todo += _reads(node)
    ids = {id(n) for n in found}
    return [n for n in model.graph.node if id(n) in ids], sorted(reads)
