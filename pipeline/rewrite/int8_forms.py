"""Other forms of an int8 QDQ model (onnxruntime's QuantizeLinear/DequantizeLinear around
standard ops), for the compilers' sake.

    weights_only   the fp32 model with each weight onnxruntime quantized replaced by the fp32
                   values its DequantizeLinear computes: int8 rounding of the weights, fp32
                   arithmetic (weight-only int8). Built from the fp32 model, not by dropping the
                   QDQ model's activation pairs: onnxruntime's quantizer folds Relu and Clip into
                   the QuantizeLinear after them (its range clamps), so dropping the pairs drops
                   those activations too.
"""
from __future__ import annotations


def _dequantized(node, inits) -> "object | None":
    """The fp32 values of a DequantizeLinear of initializers, or None."""
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    from onnx import helper, numpy_helper  # onnx: 1.5 s, not needed by doit list
    if any(i and i not in inits for i in node.input):
        return None
    x = numpy_helper.to_array(inits[node.input[0]]).astype(np.float64)
    scale = numpy_helper.to_array(inits[node.input[1]]).astype(np.float64)
    zero = (numpy_helper.to_array(inits[node.input[2]]).astype(np.float64)
            if len(node.input) > 2 and node.input[2] else np.zeros_like(scale))
    axis = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "axis"), 1)
    if scale.ndim == 1 and x.ndim > 0:
        shape = [1] * x.ndim
        shape[axis % x.ndim] = -1
        scale, zero = scale.reshape(shape), zero.reshape(shape)
    return ((x - zero) * scale).astype(np.float32)


def weights_only(fp32, qdq) -> dict:
    """Rewrite the fp32 model `fp32` in place: each of its initializers that `qdq` (its
    onnxruntime QDQ quantization) stores quantized (`<name>_quantized`, dequantized by a node)
    takes the dequantized values. Returns what it did."""
    from onnx import numpy_helper  # onnx: 1.5 s, not needed by doit list
    inits = {t.name: t for t in qdq.graph.initializer}
    values = {}
    for node in qdq.graph.node:
        if node.op_type == "DequantizeLinear" and node.input[0].endswith("_quantized"):
            v = _dequantized(node, inits)
            if v is not None:
                values[node.input[0][:-len("_quantized")]] = v
    replaced = []
    for k, t in enumerate(fp32.graph.initializer):
        if t.name in values and tuple(t.dims) == values[t.name].shape:
            fp32.graph.initializer[k].CopyFrom(numpy_helper.from_array(values[t.name], t.name))
            replaced.append(t.name)
    return {"weights_rounded": len(replaced)}
