"""Cut a detector at its last static tensors: the artifact's graph, and the post-processing as a
small ONNX graph of its own (postprocess.onnx, run on the host).

`split(model, names)` takes the spec's resolved cut tensors (spec/postprocess.py find_cut)
and returns (static part, post-processing). The static part keeps every graph input (the spec declares them
all) and returns the cut tensors, in the cut's order; the post-processing takes the cut tensors
(then the graph inputs it reads) and returns the model's outputs it computes. Both keep the
model's opsets, IR version and the initializers they read; nothing is recomputed: onnxruntime on
the post-processing, fed the static part's outputs, gives the model's own outputs.
"""
from __future__ import annotations

import copy
from pathlib import Path

from ..spec.postprocess import _graph_facts, _reads, between


def _needed(model, outputs: list[str], stop: set) -> list:
    """The nodes that compute `outputs`, walking back until `stop` (graph order)."""
    producer = {o: n for n in model.graph.node for o in n.output if o}
    todo, seen, ids = list(outputs), set(stop), set()
    while todo:
        t = todo.pop()
        if t in seen:
            continue
        seen.add(t)
        node = producer.get(t)
        if node is not None and id(node) not in ids:
            ids.add(id(node))
            todo += _reads(node)
    return [n for n in model.graph.node if id(n) in ids]


def _graph(model, name: str, nodes, inputs, outputs):
    from onnx import helper  # onnx: 1.5 s, not needed by doit list
    read = {i for n in nodes for i in _reads(n)}
    inits = [t for t in model.graph.initializer if t.name in read]
    graph = helper.make_graph(list(nodes), name, inputs, outputs, initializer=inits)
    out = helper.make_model(graph, opset_imports=list(model.opset_import))
    out.ir_version = model.ir_version
    return out


def _static(model, names: list[str], infos: dict):
    static = _graph(model, model.graph.name or "main", _needed(model, names, set()),
                    [copy.deepcopy(i) for i in model.graph.input],
                    [copy.deepcopy(infos[n]) for n in names])
    have = {t.name for t in static.graph.initializer}
    static.graph.initializer.extend(  # an old export's inputs backed by initializers stay so
        t for t in model.graph.initializer
        if t.name in {i.name for i in model.graph.input} and t.name not in have)
    for kind in ("producer_name", "producer_version", "domain", "model_version"):
        setattr(static, kind, getattr(model, kind))
    return static


def split(model, names: list[str]) -> tuple:
    """(static part, post-processing) of an onnx ModelProto cut at the tensors `names` (the
    spec's resolved cut: spec/postprocess.py find_cut). The post-processing computes the model's
    outputs that are not cut tensors."""
    import onnx  # onnx: 1.5 s, not needed by doit list
    inferred = onnx.shape_inference.infer_shapes(model)
    infos = {vi.name: vi for vi in list(inferred.graph.input) + list(inferred.graph.value_info)
             + list(inferred.graph.output)}
    names = list(names)
    missing = [n for n in names if n not in infos]
    if missing:
        raise ValueError(f"shape inference gives no type for the cut tensor(s) {', '.join(missing)}")
    static = _static(model, names, infos)
    producer, _, constants, inputs = _graph_facts(model)
    outputs = {o.name: o for o in model.graph.output if o.name not in names}
    nodes, reads = between(model, names, list(outputs), producer, inputs)
    post = _graph(model, "postprocess", nodes,
                  [copy.deepcopy(infos[n]) for n in names]
                  + [copy.deepcopy(i) for i in model.graph.input if i.name in reads],
                  [copy.deepcopy(o) for o in outputs.values()])
    for kind in ("producer_name", "producer_version", "domain", "model_version"):
        setattr(post, kind, getattr(model, kind))
    onnx.checker.check_model(static)
    onnx.checker.check_model(post)
    return static, post


def static_part(model, names: list[str]):
    """The graph up to the cut tensors `names` (every graph input kept), as split() makes it."""
    import onnx  # onnx: 1.5 s, not needed by doit list
    inferred = onnx.shape_inference.infer_shapes(model)
    infos = {vi.name: vi for vi in list(inferred.graph.input) + list(inferred.graph.value_info)
             + list(inferred.graph.output)}
    missing = [n for n in names if n not in infos]
    if missing:
        raise ValueError(f"shape inference gives no type for the cut tensor(s) {', '.join(missing)}")
    return _static(model, names, infos)


def cut_file(path, names: list[str], folder):
    """static_part() of the ONNX file at `path`, saved as folder/cut.onnx (its path)."""
    import onnx  # onnx: 1.5 s, not needed by doit list
    out = Path(folder) / "cut.onnx"
    onnx.save(static_part(onnx.load(str(path)), list(names)), str(out))
    return out


def record(post, names: list[str]) -> dict:
    """What static.json says of a cut: the cut tensors, what the post-processing reads and
    returns, its ops."""
    counts: dict = {}
    for n in post.graph.node:
        counts[n.op_type] = counts.get(n.op_type, 0) + 1
    return {"file": "postprocess.onnx", "cut": list(names),
            "inputs": [i.name for i in post.graph.input],
            "outputs": [o.name for o in post.graph.output], "ops": dict(sorted(counts.items())),
            "why": "data-dependent post-processing (spec postprocess): run on the host, on the "
                   "artifact's outputs"}
