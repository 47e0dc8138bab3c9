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

Graph surgery (pipeline/rewrite/static_rewrites.py, one function per rewrite, applied only where the
graph has the pattern, each listed in static.json under `rewrites` and checked against golden
with the rest). First, `initializer-inputs-as-constants`: a graph input that is also an
initializer (old PyTorch exports) is a constant unless the spec declares it. Before
simplifying, folding to a fixed point (pipeline/rewrite/fold.py): shape inference, constant
folding (the inputs the spec binds to one value and static shapes count as known) and the
rewrites `fold-constant-if` (If/Where with a known condition), `unroll-loop` (Loop with a known
trip count, or one its condition ends), `fold-sequences` and `decompose-contrib-ops`
(onnxruntime's com.microsoft ops as standard ONNX), pass after pass until nothing changes
(static.json `folding`); an If or Loop left because it depends on data is named when dims stay
dynamic, else the op where shape inference stops.
After, on static shapes, `reflect-pad-as-gather` (IREE 3.13 cannot compile some reflect Pads;
the same values, bit for bit: see reflect_pads_as_gathers) and `unroll-recurrent` (LSTM/GRU
where a compiler of ours lacks them). When onnxsim crashes, onnx's own constant folding with
shape inference takes its place, recorded as `simplifier`. docs/stages.md#the-static-stage
has the whole sequence.
"""
from __future__ import annotations

import collections
import math
from dataclasses import dataclass

from ..compilers import tvm_ops
from ..compilers.backend import ENTRY
from ..core.layout import golden_files, read_golden
from ..core.numerics import describe_failures, summary, tolerance_problems
from ..core.steps import StageConfig, Step
from ..core.store import pretty_json
from ..rewrite.bind_shapes import bind_inputs, localize_subgraphs
from ..rewrite import postprocess
from ..rewrite.contrib_ops import exact_reference
from ..rewrite.fold import dynamic_tensors, left_control_flow
from ..rewrite.static_rewrites import Facts, NoRewrite, _dims, apply, fold_constants
from ..run.ort import session
from ..spec.postprocess import seeds as postprocess_seeds
from ..run.reference_noise import compare_within_noise

# 2: subgraphs get their own copies of outer initializers (If/Loop bodies); 3: reflect-pad-as-gather
# rewrite; 4: the `before` phase folds to a fixed point (If/Where, Loop, sequences; static.json
# `folding`), a zero-length dim is static; 5: graph inputs backed by initializers are constants
# unless declared, a Loop of trip count 2^63 - 1 ends where its condition does; 6: float outputs
# within max(declared, k x golden's noise) (run/reference_noise.py)
VERSION = 6
OUTPUTS = ("model.onnx", "static.json")


@dataclass(frozen=True)
class Config(StageConfig):
    inputs: tuple[dict, ...]    # per input: name, shape (every dim bound), dtype
    tolerance: dict             # the simplified model vs golden: max_abs, mean_abs, cosine
    constants: tuple[dict, ...] = ()  # inputs the spec binds to one value: name, value
    cut: tuple[str, ...] = ()   # a cut detector (spec postprocess): the artifact ends at these

    def problems(self):
        if not self.inputs or any(set(i) != {"name", "shape", "dtype"} for i in self.inputs):
            yield "inputs must list each input as {name, shape, dtype}"
        elif any(not all(isinstance(d, int) and d > 0 for d in i["shape"]) for i in self.inputs):
            yield "every input dim must be bound to a positive integer"
        names = {i["name"] for i in self.inputs if isinstance(i, dict)}
        if any(set(c) != {"name", "value"} or c["name"] not in names
               or not isinstance(c["value"], int) for c in self.constants):
            yield "constants must list inputs of the model as {name, value}, value an integer"
        yield from tolerance_problems("tolerance", self.tolerance)

    def as_key(self) -> dict:
        key = super().as_key()
        if not self.cut:  # the keys of models with no postprocess are unchanged
            del key["cut"]
        return key


def constant_value(test_data: dict, dtype: str):
    """The one value an integer input's test data can take (`random` with low == high, rounded
    as golden rounds it), or None: such an input (a sample rate, a mode) is bound by the spec, and
    the static model may be specialised to it (`fold-constant-if`). Float inputs never are: a
    recurrent state whose test data is all zeros is still data."""
    rnd = test_data.get("random")
    if not rnd or not dtype.startswith(("int", "uint")):
        return None
    low, high = math.ceil(rnd["low"]), math.floor(rnd["high"])
    return low if low == high else None


# op -> why a compiler of ours cannot take it: the static stage unrolls these over the static
# sequence (`unroll-recurrent`). IREE's part is pipeline/stages/coverage.py's IREE_RULES.
def lacking_ops() -> tuple[dict, set]:
    """(op -> why a compiler of ours cannot take it, {"op:direction" that none takes})."""
    version = tvm_ops.installed_version()
    known = tvm_ops.supported_ops(version)
    lacking, nowhere = {}, set()
    for op in ("LSTM", "GRU"):
        why = []
        tvm_lacks = known is not None and op not in known
        if tvm_lacks:
            why.append(f"TVM {version}'s ONNX frontend has no {op} converter")
        if op == "GRU":
            why.append("IREE 3.13 does not lower a bidirectional or reverse GRU")
            if tvm_lacks:
                nowhere |= {"GRU:bidirectional", "GRU:reverse"}
        if why:
            lacking[op] = " and ".join(why)
    return lacking, nowhere


def constant_shapes(model) -> None:
    """Shape every Constant output that inference left without one from the Constant's own
    value (paddle2onnx's `p2o.helper.constant.*` could show as `['?']`): a false alarm otherwise."""
    from onnx import helper, numpy_helper  # onnx: 1.5 s, not needed by doit list
    known = {vi.name: vi for vi in model.graph.value_info}
    for node in model.graph.node:
        if node.op_type != "Constant" or len(node.attribute) != 1:
            continue
        a = node.attribute[0]
        value = helper.get_attribute_value(a)
        if a.name == "value":
            array = numpy_helper.to_array(value)
            shape, elem = list(array.shape), value.data_type
        elif a.name in ("value_float", "value_int"):
            shape, elem = [], 1 if a.name == "value_float" else 7
        elif a.name in ("value_floats", "value_ints"):
            shape, elem = [len(value)], 1 if a.name == "value_floats" else 7
        else:
            continue
        vi = known.get(node.output[0])
        if vi is None or _dims(vi) is None or any(not isinstance(d, int) for d in _dims(vi)):
            if vi is not None:
                model.graph.value_info.remove(vi)
            model.graph.value_info.append(helper.make_tensor_value_info(node.output[0], elem, shape))


def drop_unused_initializers(graph) -> None:
    """Outer initializers that only subgraphs read are now copied there: drop the originals."""
    used = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
    keep = [t for t in graph.initializer if t.name in used]
    if len(keep) != len(graph.initializer):
        del graph.initializer[:]
        graph.initializer.extend(keep)


def simplify(model, shapes: dict) -> tuple:
    """(simplified model, which simplifier ran and why): onnxsim; when it crashes or cannot
    verify its result, onnx's own constant folding with shape inference (rewrites.fold_constants).
    Either way the stage compares the result with golden."""
    import onnxsim  # onnxsim: 2.5 s, not needed by doit list
    try:
        simplified, ok = onnxsim.simplify(model, overwrite_input_shapes=shapes)
        if ok:
            return simplified, {"name": "onnxsim", "why": "the default simplifier"}
        why = "onnxsim could not verify its simplified model"
    except Exception as exc:
        why = f"onnxsim failed: {' '.join(str(exc).split())[:300]}"
    return fold_constants(model), {"name": "onnx-fold", "why": why + "; onnx constant folding "
                                   "and shape inference (data propagation) instead"}


class Refusal(Exception):
    """Why a model cannot be made static: what failed and what to do next (`run` raises it as
    the stage's error, which adds the model and the stage)."""

    def __init__(self, what: str, hint: str):
        super().__init__(what)
        self.what, self.hint = what, hint


def make_static(model, inputs, constants=()) -> tuple:
    """(static model, what static.json records of its making: nodes_before, simplifier,
    rewrites, folding, rewrites_declined) for a model and the spec's `inputs` ({name, shape,
    dtype}) and `constants` ({name, value}); raises Refusal. No golden check here: `run` does it."""
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    import onnx  # onnx: 1.5 s, not needed by doit list

    shapes = {i["name"]: i["shape"] for i in inputs}
    dtypes = {i["name"]: i["dtype"] for i in inputs}
    nodes_before = len(model.graph.node)
    lacking, nowhere = lacking_ops()
    facts = Facts(constants={c["name"]: np.full(shapes[c["name"]], c["value"], dtypes[c["name"]])
                             for c in constants}, lacking=lacking, nowhere=nowhere,
                  inputs=frozenset(shapes))
    rewrites = _rewrite(model, "inputs", facts)
    bind_inputs(model, shapes)
    localize_subgraphs(model.graph)
    rewrites += _rewrite(model, "before", facts)
    try:
        model, simplifier = simplify(model, shapes)
    except Exception as exc:  # onnxsim crashed, and the fallback too
        raise Refusal(f"neither onnxsim nor onnx's constant folding can simplify the model: "
                      f"{str(exc).strip().splitlines()[-1]}",
                      "check the input shapes in the spec; the model may not accept them")
    localize_subgraphs(model.graph)  # onnxsim writes subgraph shapes of its own
    drop_unused_initializers(model.graph)
    model = _strict_shapes(model)
    facts.shapes = {vi.name: _dims(vi) for vi in list(model.graph.input)
                    + list(model.graph.value_info) + list(model.graph.output)}
    after = _rewrite(model, "after", facts)
    if after:
        rewrites += after
        drop_unused_initializers(model.graph)  # the weights an unrolled op read, for example
        model = _strict_shapes(model)
    _fail_if_dynamic(model, facts)
    model.graph.name = ENTRY
    onnx.checker.check_model(model)
    return model, {"nodes_before": nodes_before, "simplifier": simplifier, "rewrites": rewrites,
                   "folding": facts.passes,
                   **({"rewrites_declined": facts.declined} if facts.declined else {})}


def _rewrite(model, phase: str, facts) -> list:
    try:
        return apply(model, phase, facts)
    except NoRewrite as exc:
        raise Refusal(str(exc), "the op stays as it is, and no compiler of ours takes it; "
                                "re-export the model without it")


def _strict_shapes(model):
    """Strict shape inference with data propagation; Constant outputs shaped from their value."""
    import onnx  # onnx: 1.5 s, not needed by doit list
    try:
        model = onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
    except Exception as exc:
        raise Refusal(f"shape inference failed on the simplified model: "
                      f"{str(exc).strip().splitlines()[-1]}",
                      "the input shapes in the spec may not be ones the model accepts")
    constant_shapes(model)
    return model


def _fail_if_dynamic(model, facts) -> None:
    """Refuse a model where a tensor keeps a dynamic dim: naming the If/Loop whose condition or
    trip count depends on data when that is why, else listing the tensors."""
    dynamic = dynamic_tensors(model)
    if not dynamic:
        return
    causes = left_control_flow(model, facts, dynamic)
    if causes:
        raise Refusal(f"control flow that depends on data remains after binding the inputs and "
                      f"folding: {'; '.join(causes)} ({len(dynamic)} tensor(s) in all have no "
                      f"static shape)",
                      "the shape depends on data at run time, so the model cannot be compiled "
                      "statically as it is; if that input takes one value in use, bind it in the "
                      "spec (an integer input with test_data random low == high), else re-export "
                      "the model without the branch")
    shown = ", ".join(dynamic[:8]) + (f" and {len(dynamic) - 8} more" if len(dynamic) > 8 else "")
    roots = _where_inference_stops(model, dynamic)
    post = [f"{n.op_type} {n.name or n.output[0]!r}" for n in postprocess_seeds(model)]
    raise Refusal(f"dynamic dims remain after binding the inputs and simplifying: {shown}"
                  + (f"; shape inference stops at {'; '.join(roots)}" if roots else "")
                  + (f"; data-dependent post-processing: {', '.join(post[:3])}" if post else ""),
                  "the detections' count depends on the data: cut the post-processing off the "
                  "artifact with `postprocess: {cut: auto}` in the spec (it ships as "
                  "postprocess.onnx, run on the host; docs/postprocess.md)" if post else
                  "the shape depends on data at run time, or on an op whose shape neither onnx's "
                  "inference (with data propagation) nor folding computes (named above); such a "
                  "model cannot be compiled statically as it is")


def _where_inference_stops(model, dynamic: list[str], most: int = 3) -> list[str]:
    """The first nodes (graph order) with an output of no static shape though every input they
    read has one: where inference stops, the others follow from them. Each as `op 'name'
    (domain) reading input [dims], ...`."""
    bad = {d.split(" ")[0] for d in dynamic}
    dims = {vi.name: _dims(vi) for vi in list(model.graph.input) + list(model.graph.value_info)
            + list(model.graph.output)}
    dims.update({t.name: list(t.dims) for t in model.graph.initializer})
    found = []
    for node in model.graph.node:
        if not any(o in bad for o in node.output) or any(i in bad for i in node.input if i):
            continue
        reads = ", ".join(f"{i} {'(no shape)' if dims.get(i) is None else dims[i]}"
                          for i in node.input if i) or "nothing"
        domain = f" (domain {node.domain})" if node.domain not in ("", "ai.onnx") else ""
        found.append(f"{node.op_type} {node.name or node.output[0]!r}{domain} reading {reads}")
        if len(found) == most:
            break
    return found


def run(ctx) -> None:
    import onnx  # onnx: 1.5 s, not needed by doit list

    source, post = onnx.load(str(ctx.input("model"))), None
    if ctx.cfg.cut:  # a cut detector: the graph up to the cut tensors; the rest, postprocess.onnx
        source, post = postprocess.split(source, ctx.cfg.cut)
        ctx.output("postprocess.onnx").write_bytes(post.SerializeToString(deterministic=True))
    try:
        model, made = make_static(source, ctx.cfg.inputs, ctx.cfg.constants)
    except Refusal as exc:
        raise ctx.error(exc.what, hint=exc.hint)
    data = model.SerializeToString(deterministic=True)
    ctx.output("model.onnx").write_bytes(data)

    doc, ins, expected = read_golden(ctx)
    # golden computed dynamic int8 products exactly (the same on any CPU): so does this check,
    # where the static model still holds such an op (a MatMulInteger onnxsim left as it was)
    exact = exact_reference(ctx.output("model.onnx"),
                            {e["name"]: a.shape for e, a in zip(doc["inputs"], ins)})
    try:
        sess = session(exact[0] if exact else ctx.output("model.onnx"))
        actual = sess.run(None, {e["name"]: a for e, a in zip(doc["inputs"], ins)})
    except Exception as exc:
        raise ctx.error(f"onnxruntime cannot run the simplified model: "
                        f"{str(exc).strip().splitlines()[-1]}")
    finally:
        if exact:
            exact[0].unlink(missing_ok=True)
    result = compare_within_noise(actual, expected, [o["name"] for o in doc["outputs"]],
                                  ctx.cfg.tolerance, doc.get("noise"))
    if not result["passed"]:
        changed_by = [made["simplifier"]["name"]] + [r["rule"] for r in made["rewrites"]]
        raise ctx.error(f"the simplified model, run in onnxruntime, differs from golden (the "
                        f"source's reference run, beyond its measured noise): "
                        f"{describe_failures(result)} ({summary(result)}); the model went "
                        f"through {', '.join(changed_by)}",
                        hint="one of those changed the numerics; report the model, or loosen "
                             "`tolerance` if the difference is acceptable (a DynamicQuantizeLSTM "
                             "that could not be unrolled exactly becomes a float LSTM, which "
                             "differs by the int8 rounding it drops: see `rewrites_declined`)")
    ops = collections.Counter(n.op_type for n in model.graph.node)
    declined = made.pop("rewrites_declined", None)
    report = {"nodes_before": made.pop("nodes_before"), "nodes": len(model.graph.node),
              "ops": dict(sorted(ops.items())), "entry": ENTRY,
              "inputs": [{"name": vi.name, "shape": _dims(vi)} for vi in model.graph.input],
              "outputs": [{"name": vi.name, "shape": _dims(vi)} for vi in model.graph.output],
              **made, **({"rewrites_declined": declined} if declined else {}),
              **({"postprocess": postprocess.record(post, ctx.cfg.cut)} if post else {}),
              "vs_original": result}
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
                              tolerance=model.tolerance.as_dict(),
                              constants=tuple(
                                  {"name": i.name, "value": value} for i in model.inputs
                                  if (value := constant_value(i.test_data.as_dict(), i.dtype))
                                  is not None),
                              cut=tuple(model.postprocess.get("cut", ()))),
                inputs=inputs, outputs=OUTPUTS + (("postprocess.onnx",) if model.postprocess else ()),
                out_dir=layout.model_stage(model.name, "static"),
                tools=("onnx", "onnxsim", "onnxruntime", "numpy", "apache-tvm"), action=run,
                layout=layout, doc="bind shapes, simplify (onnxsim), check against golden",
                where={"model": model.name})
