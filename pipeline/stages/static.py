"""Stage `static`: bind every input dim, simplify with onnxsim, infer shapes, prove nothing changed.

Dynamic dims never reach a compiler (IREE fails on them, or silently returns 1x1x0x0). After
simplification every tensor of the graph must have a fully static shape, and onnxruntime must
give the golden outputs on the static model within the model's tolerance: onnxsim is known to
break some models, so it is never trusted blindly. The graph is renamed `main`, the entry
point of every compiled artifact.

Control flow (If, Loop): shape inference cannot see through a subgraph that reads outer-scope
initializers (a Pad's pads, a Reshape's shape), nor through output shapes the exporter wrote
with symbolic dims. So before simplifying, each subgraph gets its own copy of the outer
initializers it reads and forgets its recorded shapes; then inference fills them in.

Rewrites for the compiler, applied only where the graph has the pattern, each exact (a copy of
the same values) and listed in static.json under `rewrites`:
- `reflect-pad-as-gather`: IREE 3.13 (llvm-cpu) cannot compile some reflect Pads: basic-pitch's
  [1, 1, 43844] -> [1, 1, 44100] fails with `'linalg.generic' op inferred input/output operand #0
  has shape's dimension #0 to be greater than or equal to 128, but found 113` (the tiled reversed
  slice). Measured on one-Pad models: padding the innermost axis of [1, 1, 1000] (or [1, 1000]) by
  64 or 128 fails, by 8 or 127 compiles; 128 on a non-innermost axis compiles. The rank is not the
  cause. A reflect Pad only copies elements, so every reflect Pad with constant pads becomes one
  Gather per padded axis with the constant indices reflection reads: the same values, bit for bit.
"""
from __future__ import annotations

import collections
from dataclasses import dataclass

from ..core.steps import StageConfig, Step
from ..core.store import pretty_json
from ..run.ort import session
from .plan import ENTRY, golden_files

VERSION = 3  # 2: subgraphs get their own copies of outer initializers (If/Loop bodies); 3: reflect-pad-as-gather rewrite
OUTPUTS = ("model.onnx", "static.json")
TOLERANCE_KEYS = ("max_abs", "mean_abs", "cosine")


def tolerance_problems(name: str, tolerance: dict):
    """The rule of a tolerance as numerics.compare takes it (the stages compare with golden)."""
    if sorted(tolerance) != sorted(TOLERANCE_KEYS) or not all(
            isinstance(tolerance[k], (int, float)) and not isinstance(tolerance[k], bool)
            for k in TOLERANCE_KEYS):
        yield f"{name} must give the numbers {', '.join(TOLERANCE_KEYS)}, got {tolerance!r}"


@dataclass(frozen=True)
class Config(StageConfig):
    inputs: tuple[dict, ...]    # per input: name, shape (every dim bound), dtype
    tolerance: dict             # the simplified model vs golden: max_abs, mean_abs, cosine

    def problems(self):
        if not self.inputs or any(set(i) != {"name", "shape", "dtype"} for i in self.inputs):
            yield "inputs must list each input as {name, shape, dtype}"
        elif any(not all(isinstance(d, int) and d > 0 for d in i["shape"]) for i in self.inputs):
            yield "every input dim must be bound to a positive integer"
        yield from tolerance_problems("tolerance", self.tolerance)


def _dims(value_info) -> list:
    tt = value_info.type.tensor_type
    if not tt.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else (d.dim_param or "?")
            for d in tt.shape.dim]


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


def bind_inputs(model, shapes: dict) -> None:
    """Write the spec's shapes into the graph inputs; drop stale value_info and output dims."""
    for vi in model.graph.input:
        if vi.name in shapes:
            dims = vi.type.tensor_type.shape.dim
            del dims[:]
            for size in shapes[vi.name]:
                dims.add().dim_value = size
    del model.graph.value_info[:]  # old exports carry -1 dims here that contradict the new shapes
    for vi in model.graph.output:
        for d in vi.type.tensor_type.shape.dim:
            d.Clear()


def subgraphs(graph):
    """The subgraphs of a graph's nodes (If branches, Loop/Scan bodies), one level down."""
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("g"):
                yield attr.g
            yield from attr.graphs


def localize_subgraphs(graph, outer: dict | None = None) -> None:
    """Give every subgraph its own copies of the outer initializers it reads, and drop the
    shapes recorded inside it (stale symbolic dims), so that shape inference reaches it."""
    visible = {**(outer or {}), **{t.name: t for t in graph.initializer}}
    for sub in subgraphs(graph):
        del sub.value_info[:]
        for value in sub.output:
            value.type.tensor_type.ClearField("shape")
        defined = ({t.name for t in sub.initializer} | {i.name for i in sub.input}
                   | {o for n in sub.node for o in n.output})
        used = {i for n in sub.node for i in n.input if i}
        for name in sorted(used - defined):
            if name in visible:
                sub.initializer.append(visible[name])
        localize_subgraphs(sub, visible)


def drop_unused_initializers(graph) -> None:
    """Outer initializers that only subgraphs read are now copied there: drop the originals."""
    used = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
    keep = [t for t in graph.initializer if t.name in used]
    if len(keep) != len(graph.initializer):
        del graph.initializer[:]
        graph.initializer.extend(keep)


def _reflect_indices(size: int, before: int, after: int):
    import numpy as np
    idx = np.abs(np.arange(-before, size + after))          # reflect about the first element
    return np.where(idx > size - 1, 2 * (size - 1) - idx, idx).astype(np.int64)  # ... and the last


def reflect_pads_as_gathers(model) -> list[str]:
    """Replace each reflect Pad with constant pads by Gathers along its padded axes; returns the
    names of the nodes replaced. Needs the shapes of strict shape inference."""
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


def run(ctx) -> None:
    import onnx
    import onnxsim
    from . import golden
    from ..core.numerics import compare, describe_failures, summary

    model = onnx.load(str(ctx.input("model")))
    shapes = {i["name"]: i["shape"] for i in ctx.cfg.inputs}
    nodes_before = len(model.graph.node)
    bind_inputs(model, shapes)
    localize_subgraphs(model.graph)
    try:
        model, ok = onnxsim.simplify(model, overwrite_input_shapes=shapes)
    except Exception as exc:
        raise ctx.error(f"onnxsim failed: {str(exc).strip().splitlines()[-1]}",
                        hint="check the input shapes in the spec; the model may not accept them")
    if not ok:
        raise ctx.error("onnxsim could not verify its simplified model",
                        hint="check the input shapes in the spec")
    localize_subgraphs(model.graph)  # onnxsim writes subgraph shapes of its own
    drop_unused_initializers(model.graph)
    try:
        model = onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
    except Exception as exc:
        raise ctx.error(f"shape inference failed on the simplified model: "
                        f"{str(exc).strip().splitlines()[-1]}",
                        hint="the input shapes in the spec may not be ones the model accepts")
    rewrites = []
    replaced = reflect_pads_as_gathers(model)
    if replaced:
        rewrites.append({"rule": "reflect-pad-as-gather", "nodes": replaced,
                         "why": "IREE 3.13 llvm-cpu fails to compile reflect Pad of this size; "
                                "Gather with constant indices copies the same elements"})
        model = onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
    dynamic = dynamic_tensors(model)
    if dynamic:
        shown = ", ".join(dynamic[:8]) + (f" and {len(dynamic) - 8} more" if len(dynamic) > 8 else "")
        raise ctx.error(f"dynamic dims remain after binding the inputs and simplifying: {shown}",
                        hint="the shape depends on data at run time; such a model cannot be "
                             "compiled statically as it is")
    model.graph.name = ENTRY
    onnx.checker.check_model(model)
    data = model.SerializeToString(deterministic=True)
    ctx.output("model.onnx").write_bytes(data)

    doc, ins, expected = golden.load(ctx)
    try:
        sess = session(ctx.output("model.onnx"))
        actual = sess.run(None, {e["name"]: a for e, a in zip(doc["inputs"], ins)})
    except Exception as exc:
        raise ctx.error(f"onnxruntime cannot run the simplified model: "
                        f"{str(exc).strip().splitlines()[-1]}")
    result = compare(actual, expected, [o["name"] for o in doc["outputs"]], ctx.cfg.tolerance)
    if not result["passed"]:
        raise ctx.error(f"the simplified model differs from the original in onnxruntime: "
                        f"{describe_failures(result)} ({summary(result)})",
                        hint="onnxsim changed the numerics; report the model, or loosen "
                             "`tolerance` if the difference is acceptable")
    ops = collections.Counter(n.op_type for n in model.graph.node)
    report = {"nodes_before": nodes_before, "nodes": len(model.graph.node),
              "ops": dict(sorted(ops.items())), "entry": ENTRY,
              "inputs": [{"name": vi.name, "shape": _dims(vi)} for vi in model.graph.input],
              "outputs": [{"name": vi.name, "shape": _dims(vi)} for vi in model.graph.output],
              "rewrites": rewrites, "vs_original": result}
    ctx.output("static.json").write_text(pretty_json(report))


# ----------------------------------------------------------------------------- steps
def steps(project) -> list:
    return [static_step(project.layout, m) for m in project.models]


def static_step(layout, model) -> Step:
    inputs = {"model": layout.model_stage(model.base, "import") / "model.onnx",
              **golden_files(layout, model)}
    return Step(stage="static", name=model.name, version=VERSION,
                config=Config(inputs=tuple({"name": i.name, "shape": list(i.shape), "dtype": i.dtype}
                                           for i in model.inputs),
                              tolerance=model.tolerance.as_dict()),
                inputs=inputs, outputs=OUTPUTS,
                out_dir=layout.model_stage(model.name, "static"),
                tools=("onnx", "onnxsim", "onnxruntime", "numpy"), action=run,
                layout=layout, doc="bind shapes, simplify (onnxsim), check against golden",
                where={"model": model.name})
