"""nnef-tools custom converters (loaded by module name: --custom-converters pipeline.rewrite.nnef_fixes).

nnef-tools 1.0.11 converts TFLite PRELU without moving its alpha to the NCHW layout it moves the
activations to: alpha [1, 1, C] against x [1, C, H, W] fails NNEF shape inference (seen on
mediapipe face_landmark). Here alpha goes through the same `convert_binarg` as ADD's second
operand, which transposes or reshapes it to match. The other gaps filled here are described
where they are filled. `python -m pipeline.rewrite.nnef_fixes ARGS` runs `nnef_tools.convert ARGS` with
shape-op folding added (sources.py converts through it).
"""
import collections
import runpy
import sys

import numpy as np
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


# TFLite ops nnef-tools 1.0.11 has no transform for, seen in MediaPipe models, written as NNEF
# fragments (CUSTOM_FRAGMENTS, given with --custom-fragments) that the NNEF -> ONNX step decomposes
# into NNEF primitives (DECOMPOSE, its --decompose) or converts itself (depth_to_space). Fused
# activations (fused_activation_function) of the ops nnef-tools honours them on (convolutions,
# FULLY_CONNECTED, CONCATENATION) come out as RELU, TANH, the fragment `relu6` or one of
# ACTIVATIONS below (patched into the converter by _main); those of other ops are made ops of
# their own, and a TANH or SIGN_BIT that LiteRT ignores is removed, in the TFLite graph before
# (tflite_rewrite.py).
from nnef_tools.conversion.onnx_to_nnef import _DEPTH_TO_SPACE_FRAGMENT  # noqa: E402

CUSTOM_FRAGMENTS = {
    # TFLite reference kernel: x * min(6, max(0, x + 3)) / 6
    "hard_swish": """
fragment hard_swish( input: tensor<scalar> ) -> ( output: tensor<scalar> )
{
    output = div(mul(input, clamp(add(input, 3.0), 0.0, 6.0)), 6.0);
}
""",
    "relu_n1_to_1": """
fragment relu_n1_to_1( input: tensor<scalar> ) -> ( output: tensor<scalar> )
{
    output = clamp(input, -1.0, 1.0);
}
""",
    "relu_0_to_1": """
fragment relu_0_to_1( input: tensor<scalar> ) -> ( output: tensor<scalar> )
{
    output = clamp(input, 0.0, 1.0);
}
""",
    "depth_to_space": _DEPTH_TO_SPACE_FRAGMENT,  # nnef-tools' own (its ONNX reader defines it)
}
DECOMPOSE = ("relu6", "hard_swish", "relu_n1_to_1", "relu_0_to_1")
ACTIVATIONS = {"RELU_N1_TO_1": "relu_n1_to_1"}  # fused activation -> NNEF fragment

for _op in ("HARD_SWISH", "RELU_N1_TO_1", "RELU_0_TO_1"):
    CUSTOM_TRANSFORMS[_op] = Transform(type=_op.lower(), inputs="!I[0]",
                                       outputs="!transpose_like(O[0], I[0])")

# TFLite DEPTH_TO_SPACE (NHWC) is TF's: ONNX DepthToSpace mode DCR on the NCHW working layout.
CUSTOM_TRANSFORMS["DEPTH_TO_SPACE"] = Transform(
    type="depth_to_space", inputs="!transpose_input(I[0])", outputs="!transpose_output(O[0])",
    attribs={"block_size": "!block_size", "blocks_first": True})

# TFLite TRANSPOSE_CONV: nnef-tools 1.0.11 derives the padding's rank from its first operand, the
# output shape vector (rank 1), so VALID becomes [] (NNEF's automatic, SAME-like padding) and the
# NNEF shape check fails. The same transform with the rank of the data operand (I[2]).
CUSTOM_TRANSFORMS["TRANSPOSE_CONV"] = Transform(
    type="deconv",
    inputs=("!transpose_input(I[2])", '!transpose_filter(I[1], format="CXN")'),
    outputs="!transpose_output(O[0])",
    attribs={"stride": "![stride_h, stride_w]", "padding": "!convert_padding(padding, I[2].rank - 2)",
             "output_shape": "!nxc_to_ncx(as_const(I[0]))", "groups": 1})

# NNEF -> ONNX deconv: nnef-tools 1.0.11 writes NNEF's full output_shape [N, C, H, W] into
# ConvTranspose's `output_shape`, which ONNX wants spatial ([H, W]; onnxruntime rejects the model),
# and leaves the split of an automatic padding to SAME_UPPER. Here the pads are explicit, computed
# as NNEF (and TFLite TRANSPOSE_CONV) define them: total = full size - output size, floor half
# first; a larger output than the full size is output_padding.
def deconv_pads(converter, input_shape, filter_shape, output_shape, padding, stride, dilation):
    """(ONNX pads [begins..., ends...], output_padding) of an NNEF deconv (public: nnef-tools
    passes the converter first)."""
    n = len(input_shape) - 2
    stride, dilation = list(stride) or [1] * n, list(dilation) or [1] * n
    begins, ends, extra = [], [], []
    for i in range(n):
        full = stride[i] * (input_shape[2 + i] - 1) + (filter_shape[2 + i] - 1) * dilation[i] + 1
        if padding:
            b, e = padding[i]
        else:
            total = max(full - output_shape[2 + i], 0)
            b, e = total // 2, total - total // 2
        begins.append(b)
        ends.append(e)
        extra.append(output_shape[2 + i] - (full - b - e))
    if any(x < 0 for x in extra):
        raise ValueError(f"deconv output {output_shape} is smaller than its padding allows")
    return begins + ends, extra


CUSTOM_TRANSFORMS["deconv"] = Transform(
    type="ConvTranspose",
    defaults={"output_shape": None},
    using={"group": "!groups if groups != 0 else O[0].shape[1]",
           "pads": "!deconv_pads(I[0].shape, I[1].shape, O[0].shape, padding, stride, dilation)"},
    cond={"!I[2].rank != 0 or (is_const(I[2]) and as_const(I[2]) == 0)": "bias must be constant 0 or of rank 1"},
    inputs=("!I[0]", "!I[1]", "!squeeze_vector(I[2]) if I[2].rank != 0 else None"),
    outputs="!O[0]",
    attribs={"pads": "!pads[0]", "output_padding": "!pads[1] if any(pads[1]) else None",
             "strides": "!stride", "dilations": "!dilation", "group": "!group",
             "kernel_shape": "!I[1].shape[2:]"})

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
    """`python -m pipeline.rewrite.nnef_fixes ARGS`: `python -m nnef_tools.convert ARGS`, with the TFLite
    reader's optimizer followed by `fold_shape_ops` (nnef-tools has no hook for that step) and the
    fused activations of ACTIVATIONS known to the TFLite converter."""
    # nnef-tools: 0.2 s, what _main patches before nnef-tools runs
    from nnef_tools.optimization import tflite_optimizer

    original = tflite_optimizer.Optimizer.__call__

    def optimize_then_fold(self, graph, only_required=False):
        graph = original(self, graph, only_required=only_required)
        folded = fold_shape_ops(graph)
        if folded:
            print(f"pipeline.rewrite.nnef_fixes: folded {len(folded)} constant shape op(s): "
                  f"{dict(sorted(collections.Counter(folded).items()))}", flush=True)
        return graph

    tflite_optimizer.Optimizer.__call__ = optimize_then_fold
    # nnef-tools: 0.2 s, what _main patches before nnef-tools runs
    from nnef_tools.conversion import tflite_to_nnef
    tflite_to_nnef.Converter._ActivationOpTypes = {**tflite_to_nnef.Converter._ActivationOpTypes,
                                                   **ACTIVATIONS}
    sys.argv = ["nnef_tools.convert", *argv]
    runpy.run_module("nnef_tools.convert", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    _main(sys.argv[1:])
