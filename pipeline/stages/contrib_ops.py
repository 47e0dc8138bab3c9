"""`decompose-contrib-ops`: onnxruntime's com.microsoft ops as standard ONNX (no compiler of ours
takes them). Registered in pipeline/stages/rewrites.py."""
from __future__ import annotations

from .graph_edit import Facts, NoRewrite, _Builder, _attrs, _inits, _replace


def _dequantized(inits, q: str, scale: str, zero: str | None, axis_of_channel: int | None = None):
    import numpy as np
    w = inits[q].astype(np.float32)
    s = inits[scale].astype(np.float32)
    z = inits[zero].astype(np.float32) if zero else np.float32(0)
    if s.ndim and axis_of_channel is not None and s.size > 1:  # per output channel
        shape = [1] * w.ndim
        shape[axis_of_channel] = -1
        s, z = s.reshape(shape), (z.reshape(shape) if np.ndim(z) else z)
    return ((w - z) * s).astype(np.float32)


def decompose_contrib_ops(model, facts: Facts) -> list[str]:
    """onnxruntime's com.microsoft ops, which no compiler takes, as standard ONNX:
    DynamicQuantizeLSTM -> LSTM on the dequantized weights; DynamicQuantizeMatMul -> MatMul (+ Add)
    on the dequantized weights. Both dequantize their activations on the fly in onnxruntime: the
    float op skips that rounding (the golden check shows by how much)."""
    graph = model.graph
    inits = _inits(graph)
    replacements, touched = {}, []
    for k, node in enumerate(graph.node):
        if node.domain != "com.microsoft":
            continue
        b = _Builder(graph, node.name or node.output[0])
        ins = list(node.input) + [""] * (12 - len(node.input))
        if node.op_type == "DynamicQuantizeLSTM":
            missing = [ins[i] for i in (1, 2, 8, 9, 10, 11) if ins[i] not in inits]
            if missing:
                raise NoRewrite(f"DynamicQuantizeLSTM {node.name!r}: its weights {missing} are not "
                                f"constants, so they cannot be dequantized ahead of time")
            # W: [dirs, input, 4H], R: [dirs, H, 4H]; per-direction (or per-channel) scales
            w = _dequant_rnn(inits, ins[1], ins[8], ins[9])
            r = _dequant_rnn(inits, ins[2], ins[10], ins[11])
            lstm_in = [ins[0], b.const(w, "W"), b.const(r, "R")] + ins[3:8]
            while lstm_in and not lstm_in[-1]:
                lstm_in.pop()
            attrs = _attrs(node)
            b.op("LSTM", lstm_in, out=list(node.output), **attrs)
        elif node.op_type == "DynamicQuantizeMatMul":
            # A (float), B (int8/uint8 constant), b_scale, b_zero_point, bias
            if ins[1] not in inits or ins[2] not in inits or (ins[3] and ins[3] not in inits):
                raise NoRewrite(f"DynamicQuantizeMatMul {node.name!r}: B, its scale and zero "
                                f"point must be constants")
            w = _dequantized(inits, ins[1], ins[2], ins[3] or None, axis_of_channel=-1)
            if ins[4]:
                out = b.op("MatMul", [ins[0], b.const(w, "B")])
                b.op("Add", [out, ins[4]], out=[node.output[0]])
            else:
                b.op("MatMul", [ins[0], b.const(w, "B")], out=[node.output[0]])
        else:
            raise NoRewrite(f"com.microsoft {node.op_type} ({node.name or node.output[0]}): no "
                            f"compiler takes onnxruntime's contrib ops and no rewrite into "
                            f"standard ONNX is known for this one (DynamicQuantizeLSTM and "
                            f"DynamicQuantizeMatMul are)")
        replacements[k] = b.nodes
        touched.append(node.name or node.output[0])
    _replace(graph, replacements)
    if touched and not any(n.domain == "com.microsoft" for n in graph.node):
        keep = [o for o in model.opset_import if o.domain != "com.microsoft"]
        del model.opset_import[:]
        model.opset_import.extend(keep)
    return touched


def _dequant_rnn(inits, q: str, scale: str, zero: str):
    """DynamicQuantizeLSTM's W [dirs, in, 4H] (R [dirs, H, 4H]) in float, transposed to the
    LSTM layout [dirs, 4H, in]; the scale is per direction, or per direction and column."""
    import numpy as np
    w = inits[q].astype(np.float32)
    s = inits[scale].astype(np.float32)
    z = inits[zero].astype(np.float32)
    dirs = w.shape[0]
    s = s.reshape(dirs, 1, -1)
    z = z.reshape(dirs, 1, -1)
    return np.ascontiguousarray(((w - z) * s).transpose(0, 2, 1)).astype(np.float32)
