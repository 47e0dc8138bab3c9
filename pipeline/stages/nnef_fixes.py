"""nnef-tools custom converters (loaded by module name: --custom-converters pipeline.stages.nnef_fixes).

nnef-tools 1.0.11 converts TFLite PRELU without moving its alpha to the NCHW layout it moves the
activations to: alpha [1, 1, C] against x [1, C, H, W] fails NNEF shape inference (seen on
mediapipe face_landmark). Here alpha goes through the same `convert_binarg` as ADD's second
operand, which transposes or reshapes it to match. The other gaps filled here are described
where they are filled. `python -m pipeline.stages.nnef_fixes ARGS` runs `nnef_tools.convert ARGS` with
shape-op folding added (sources.py converts through it).
"""
import sys

from nnef_tools.conversion.converter import Transform

CUSTOM_TRANSFORMS = {
    "PRELU": Transform(type="prelu", inputs=("!I[0]", "!convert_binarg(I[1], I[0])"),
                       outputs="!transpose_like(O[0], I[0])"),
}

# SELECT_V2 (TFLite's broadcasting select, in basic-pitch) has no transform in nnef-tools 1.0.11;
# NNEF `select` broadcasts, so SELECT's transform (operands brought to the condition's layout) fits.
CUSTOM_TRANSFORMS["SELECT_V2"] = Transform(
    type="select", inputs=("!I[0]", "!convert_binarg(I[1], I[0])", "!convert_binarg(I[2], I[0])"),
    outputs="!transpose_like(O[0], ref=I[0])")

# NNEF -> ONNX: nnef-tools 1.0.11 has no converter for NNEF `stack` (what TFLite PACK becomes; 9 in
# basic-pitch). stack(values, axis) == Concat of each value unsqueezed at `axis` (NNEF gives a
# non-negative axis here). Keys are NNEF op names (lower case), TFLite ones upper case: no clash.
CUSTOM_TRANSFORMS["stack"] = Transform(
    type="Concat", inputs=["![unsqueeze_input(t, [axis]) for t in I]"], outputs="!O[0]",
    attribs={"axis": "!axis"})


# ----------------------------------------------------------------------------- shape folding
# nnef-tools 1.0.11 converts a TFLite RESHAPE only when its shape operand is a constant. Models
# exported from Keras with a dynamic batch (basic-pitch) compute that operand at run time:
# SHAPE -> STRIDED_SLICE -> PACK. nnef-tools' own TFLite optimizer already replaces SHAPE of a
# statically shaped tensor by a constant, but folds nothing after it, so RESHAPE fails with
# "trying to evaluate non-constant tensor". `fold_shape_ops` finishes the job: every integer op
# of the kinds below whose operands are all constants is evaluated with numpy (TFLite semantics)
# and replaced by its value. Only integer (shape) arithmetic is folded, never float data, so the
# numerics of the model are untouched; the tensor shapes are the TFLite file's own static ones.

def _strided_slice(x, begin, end, strides, attribs):
    if attribs.get("ellipsis_mask") or attribs.get("new_axis_mask"):
        return None
    index = []
    for axis in range(len(begin)):
        if attribs.get("shrink_axis_mask", 0) >> axis & 1:
            index.append(int(begin[axis]))
            continue
        lo = None if attribs.get("begin_mask", 0) >> axis & 1 else int(begin[axis])
        hi = None if attribs.get("end_mask", 0) >> axis & 1 else int(end[axis])
        index.append(slice(lo, hi, int(strides[axis])))
    return x[tuple(index)]


def _fold(op, args):
    import numpy as np
    t = op.type
    if t == "STRIDED_SLICE" and len(args) == 4:
        return _strided_slice(args[0], args[1], args[2], args[3], op.attribs)
    if t == "PACK":
        return np.stack(args, axis=op.attribs.get("axis", 0))
    if t == "CONCATENATION":
        return np.concatenate(args, axis=op.attribs.get("axis", 0))
    if t in ("RESHAPE", "SQUEEZE", "EXPAND_DIMS"):
        return np.reshape(args[0], op.output.shape)
    if t in ("ADD", "SUB", "MUL") and op.attribs.get("fused_activation_function") in (None, "NONE"):
        return {"ADD": np.add, "SUB": np.subtract, "MUL": np.multiply}[t](args[0], args[1])
    if t == "CAST":
        return args[0].astype(op.output.dtype)
    return None


def fold_shape_ops(graph) -> list[str]:
    """Evaluate integer ops with constant operands (shape arithmetic); returns the folded op types."""
    import numpy as np
    folded = []
    changed = True
    while changed:
        changed = False
        for op in list(graph.operations):
            if len(op.outputs) != 1 or not op.inputs or any(t.data is None for t in op.inputs):
                continue
            out = op.output
            if not np.issubdtype(np.dtype(out.dtype), np.integer) or out.shape is None:
                continue
            value = _fold(op, [np.asarray(t.data) for t in op.inputs])
            if value is None or tuple(value.shape) != tuple(out.shape):
                continue
            out.data = np.asarray(value, dtype=out.dtype)
            graph.remove_operation(op, unlink=True)
            folded.append(op.type)
            changed = True
    return folded


def _main(argv: list[str]) -> None:
    """`python -m pipeline.stages.nnef_fixes ARGS`: `python -m nnef_tools.convert ARGS`, with the TFLite
    reader's optimizer followed by `fold_shape_ops` (nnef-tools has no hook for that step)."""
    import collections
    import runpy
    from nnef_tools.optimization import tflite_optimizer

    original = tflite_optimizer.Optimizer.__call__

    def optimize_then_fold(self, graph, only_required=False):
        graph = original(self, graph, only_required=only_required)
        folded = fold_shape_ops(graph)
        if folded:
            print(f"pipeline.stages.nnef_fixes: folded {len(folded)} constant shape op(s): "
                  f"{dict(sorted(collections.Counter(folded).items()))}", flush=True)
        return graph

    tflite_optimizer.Optimizer.__call__ = optimize_then_fold
    sys.argv = ["nnef_tools.convert", *argv]
    runpy.run_module("nnef_tools.convert", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    _main(sys.argv[1:])
