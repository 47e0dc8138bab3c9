"""Generated TFLite graph families (issue 28, item 5): what real TFLite exporters vary and the
nnef-tools route refused in the private corpus. Each family is a list of small models, written
with the object API of the schema LiteRT ships (ai_edge_litert.schema_py_generated), seeded, so
that a test can convert every member and compare it with LiteRT on the original.

    family        what varies
    quantized     full-integer uint8 and int8: quantized input/output or float I/O with QUANTIZE /
                  DEQUANTIZE at the boundary; per-tensor and per-channel conv weights
    resize        RESIZE_BILINEAR: align_corners / half_pixel_centers / neither, integer and
                  non-integer factors (33 -> 257 with align_corners, as a segmentation head does)
    dilated       DEPTHWISE_CONV_2D with dilation 2 and 3, SAME and VALID, depth multiplier 1 and 2
    l2norm        L2_NORMALIZATION over the last axis of 2-D and 4-D tensors
    shape_chain   SHAPE -> STRIDED_SLICE -> PACK -> RESHAPE (Keras' dynamic-batch flatten), batch -1
    batch         a CONV_2D/MEAN/FULLY_CONNECTED classifier whose signature has batch -1

`members()` lists them all as (family, name, bytes).
"""
from __future__ import annotations

import numpy as np

FLOAT32, INT32, UINT8, INT64, INT8 = 0, 2, 3, 4, 9
SAME, VALID = 0, 1  # the schema's Padding enum


def _schema():
    from ai_edge_litert import schema_py_generated as S
    return S


class Graph:
    """A one-subgraph TFLite model under construction: tensors, constant buffers, operators."""

    def __init__(self, seed: int = 0):
        S = _schema()
        self.S, self.rng = S, np.random.default_rng(seed)
        self.model = S.ModelT()
        self.model.version = 3
        self.model.buffers = [S.BufferT()]  # buffer 0: the empty one every tensor without data uses
        self.model.operatorCodes = []
        self.sub = S.SubGraphT()
        self.sub.tensors, self.sub.operators, self.sub.inputs, self.sub.outputs = [], [], [], []
        self.model.subgraphs = [self.sub]

    def tensor(self, name, shape, dtype=FLOAT32, data=None, quant=None, signature=None) -> int:
        S = self.S
        t = S.TensorT()
        t.name, t.shape, t.type = name.encode(), list(shape), dtype
        if signature is not None:
            t.shapeSignature = list(signature)
        t.buffer = 0
        if data is not None:
            buf = S.BufferT()
            buf.data = np.frombuffer(np.ascontiguousarray(data).tobytes(), np.uint8)
            self.model.buffers.append(buf)
            t.buffer = len(self.model.buffers) - 1
        if quant is not None:
            q = S.QuantizationParametersT()
            scale, zero, q.quantizedDimension = quant if len(quant) == 3 else (*quant, 0)
            q.scale = list(np.atleast_1d(np.asarray(scale, np.float32)))
            q.zeroPoint = list(np.atleast_1d(np.asarray(zero, np.int64)))
            t.quantization = q
        self.sub.tensors.append(t)
        return len(self.sub.tensors) - 1

    def const(self, name, array, dtype=None, quant=None) -> int:
        dtype = {np.float32: FLOAT32, np.int32: INT32, np.uint8: UINT8, np.int8: INT8,
                 np.int64: INT64}[array.dtype.type] if dtype is None else dtype
        return self.tensor(name, array.shape, dtype, data=array, quant=quant)

    def op(self, code: int, inputs, outputs, options=None, options_type: str = "NONE") -> None:
        S = self.S
        codes = [c.builtinCode for c in self.model.operatorCodes]
        if code not in codes:
            c = S.OperatorCodeT()
            c.builtinCode, c.deprecatedBuiltinCode, c.version = code, min(code, 127), 1
            self.model.operatorCodes.append(c)
            codes.append(code)
        o = S.OperatorT()
        o.opcodeIndex, o.inputs, o.outputs = codes.index(code), list(inputs), list(outputs)
        o.builtinOptionsType = getattr(S.BuiltinOptions, options_type)
        o.builtinOptions = options
        self.sub.operators.append(o)

    def options(self, kind: str, **fields):
        o = getattr(self.S, kind + "T")()
        for k, v in fields.items():
            setattr(o, k, v)
        return o

    def finish(self, inputs, outputs) -> bytes:
        import flatbuffers
        self.sub.inputs, self.sub.outputs = list(inputs), list(outputs)
        b = flatbuffers.Builder(1 << 16)
        b.Finish(self.model.Pack(b), file_identifier=b"TFL3")
        return bytes(b.Output())


def _op(name: str) -> int:
    return getattr(_schema().BuiltinOperator, name)


# ----------------------------------------------------------------------------- quantized
def _quantize(x, scale, zero, dtype):
    info = np.iinfo(dtype)
    return np.clip(np.round(x / scale) + zero, info.min, info.max).astype(dtype)


def quantized(dtype: str = "uint8", per_channel: bool = False, float_io: bool = False,
              seed: int = 0) -> bytes:
    """A full-integer classifier as TFLite's converter writes it: [QUANTIZE] -> CONV_2D (RELU6) ->
    DEPTHWISE_CONV_2D (RELU) -> AVERAGE_POOL_2D -> RESHAPE -> FULLY_CONNECTED -> SOFTMAX
    [-> DEQUANTIZE]; 1x12x12x3 in, 1x5 out. uint8: asymmetric weights, per-tensor (TFLite has no
    per-channel uint8 convolution); int8: symmetric weights, per-tensor or per-output-channel."""
    g = Graph(seed)
    rng = g.rng
    np_t, tf_t = (np.uint8, UINT8) if dtype == "uint8" else (np.int8, INT8)
    z_act = 128 if dtype == "uint8" else 0  # activations centred ...
    offset = 0 if dtype == "uint8" else -128  # ... or shifted: uint8 zero points, int8 = uint8 - 128

    def act(name, shape, scale, zero):
        return g.tensor(name, shape, tf_t, quant=(scale, zero + offset))

    def weights(name, shape, channel_axis):
        w = rng.standard_normal(shape).astype(np.float32) * 0.5
        if dtype == "uint8":
            lo, hi = float(min(w.min(), 0)), float(max(w.max(), 0))
            scale = (hi - lo) / 255
            zero = int(round(-lo / scale))
            return g.const(name, _quantize(w, scale, zero, np.uint8), quant=(scale, zero)), np.float32(scale)
        axes = tuple(a for a in range(w.ndim) if a != channel_axis)
        amax = np.abs(w).max(axis=axes) if per_channel else np.abs(w).max()
        scale = np.maximum(amax, 1e-6).astype(np.float32) / 127
        shaped = scale.reshape([-1 if a == channel_axis else 1 for a in range(w.ndim)]) if per_channel else scale
        q = np.clip(np.round(w / shaped), -127, 127).astype(np.int8)
        zeros = np.zeros(np.size(scale), np.int64)
        return g.const(name, q, quant=(scale, zeros, channel_axis if per_channel else 0)), scale

    def bias(name, n, scale):
        b = rng.standard_normal(n).astype(np.float32) * 0.1
        scale = np.broadcast_to(np.asarray(scale, np.float32), (n,))
        q = np.round(b / scale).astype(np.int32)
        return g.const(name, q, quant=(scale, np.zeros(n, np.int64)))

    s_in = 1 / 255
    if float_io:
        x = g.tensor("input", [1, 12, 12, 3])
        xq = act("input_q", [1, 12, 12, 3], s_in, 0 if dtype == "uint8" else 0)
        g.op(_op("QUANTIZE"), [x], [xq])
    else:
        x = xq = act("input", [1, 12, 12, 3], s_in, 0)
    w1, s_w1 = weights("conv_w", (8, 3, 3, 3), 0)
    c1 = act("conv", [1, 6, 6, 8], 6 / 255, 0)
    g.op(_op("CONV_2D"), [xq, w1, bias("conv_b", 8, s_in * s_w1)], [c1],
         g.options("Conv2DOptions", padding=SAME, strideW=2, strideH=2, fusedActivationFunction=3,
                   dilationWFactor=1, dilationHFactor=1), "Conv2DOptions")
    w2, s_w2 = weights("dw_w", (1, 3, 3, 8), 3)
    c2 = act("dw", [1, 6, 6, 8], 4 / 255, 0)
    g.op(_op("DEPTHWISE_CONV_2D"), [c1, w2, bias("dw_b", 8, 6 / 255 * s_w2)], [c2],
         g.options("DepthwiseConv2DOptions", padding=SAME, strideW=1, strideH=1, depthMultiplier=1,
                   fusedActivationFunction=1, dilationWFactor=1, dilationHFactor=1),
         "DepthwiseConv2DOptions")
    p = act("pool", [1, 1, 1, 8], 4 / 255, 0)
    g.op(_op("AVERAGE_POOL_2D"), [c2], [p],
         g.options("Pool2DOptions", padding=VALID, strideW=6, strideH=6, filterWidth=6,
                   filterHeight=6), "Pool2DOptions")
    flat = act("flat", [1, 8], 4 / 255, 0)
    g.op(_op("RESHAPE"), [p, g.const("flat_shape", np.array([1, 8], np.int32))], [flat],
         g.options("ReshapeOptions", newShape=[1, 8]), "ReshapeOptions")
    w3, s_w3 = weights("fc_w", (5, 8), 0)
    logits = act("logits", [1, 5], 0.05, z_act)
    g.op(_op("FULLY_CONNECTED"), [flat, w3, bias("fc_b", 5, 4 / 255 * s_w3)], [logits],
         g.options("FullyConnectedOptions"), "FullyConnectedOptions")
    probs = act("probs", [1, 5], 1 / 256, 0)
    g.op(_op("SOFTMAX"), [logits], [probs], g.options("SoftmaxOptions", beta=1.0), "SoftmaxOptions")
    out = probs
    if float_io:
        out = g.tensor("probs_float", [1, 5])
        g.op(_op("DEQUANTIZE"), [probs], [out])
    return g.finish([x], [out])


# ----------------------------------------------------------------------------- float families
def resize(size_in: int, size_out: int, align_corners: bool = False, half_pixel: bool = False,
           seed: int = 0) -> bytes:
    """CONV_2D 1x1 -> RESIZE_BILINEAR (size_in -> size_out, both axes) -> CONV_2D 1x1 (a
    segmentation head's upsampling); 1 x size_in x size_in x 4 in."""
    g = Graph(seed)
    x = g.tensor("input", [1, size_in, size_in, 4])
    c = _conv(g, x, [1, size_in, size_in, 6], 1, "head")
    up = g.tensor("upsampled", [1, size_out, size_out, 6])
    g.op(_op("RESIZE_BILINEAR"), [c, g.const("size", np.array([size_out, size_out], np.int32))], [up],
         g.options("ResizeBilinearOptions", alignCorners=align_corners, halfPixelCenters=half_pixel),
         "ResizeBilinearOptions")
    y = _conv(g, up, [1, size_out, size_out, 2], 1, "mask")
    return g.finish([x], [y])


def _conv(g: Graph, x: int, out_shape, kernel: int, name: str, stride: int = 1) -> int:
    cin = g.sub.tensors[x].shape[-1]
    w = g.const(f"{name}_w", g.rng.standard_normal((out_shape[-1], kernel, kernel, cin)).astype(np.float32) * 0.5)
    b = g.const(f"{name}_b", g.rng.standard_normal(out_shape[-1]).astype(np.float32) * 0.1)
    y = g.tensor(name, out_shape)
    g.op(_op("CONV_2D"), [x, w, b], [y],
         g.options("Conv2DOptions", padding=SAME, strideW=stride, strideH=stride,
                   dilationWFactor=1, dilationHFactor=1), "Conv2DOptions")
    return y


def dilated(dilation: int = 2, padding: int = SAME, multiplier: int = 1, seed: int = 0) -> bytes:
    """CONV_2D 1x1 -> DEPTHWISE_CONV_2D 3x3 dilated (an atrous segmentation block); 1x17x17x4 in."""
    g = Graph(seed)
    x = g.tensor("input", [1, 17, 17, 4])
    c = _conv(g, x, [1, 17, 17, 4], 1, "pre")
    size = 17 if padding == SAME else 17 - 2 * dilation
    w = g.const("dw_w", g.rng.standard_normal((1, 3, 3, 4 * multiplier)).astype(np.float32))
    b = g.const("dw_b", g.rng.standard_normal(4 * multiplier).astype(np.float32) * 0.1)
    y = g.tensor("atrous", [1, size, size, 4 * multiplier])
    g.op(_op("DEPTHWISE_CONV_2D"), [c, w, b], [y],
         g.options("DepthwiseConv2DOptions", padding=padding, strideW=1, strideH=1,
                   depthMultiplier=multiplier, fusedActivationFunction=1,
                   dilationWFactor=dilation, dilationHFactor=dilation), "DepthwiseConv2DOptions")
    return g.finish([x], [y])


def l2norm(rank: int = 2, seed: int = 0) -> bytes:
    """FULLY_CONNECTED -> L2_NORMALIZATION (a keyword-spotting embedding, 1x128) or CONV_2D ->
    L2_NORMALIZATION over the channels of 1x6x6x8."""
    g = Graph(seed)
    if rank == 2:
        x = g.tensor("input", [1, 40])
        w = g.const("fc_w", g.rng.standard_normal((128, 40)).astype(np.float32))
        b = g.const("fc_b", g.rng.standard_normal(128).astype(np.float32))
        h = g.tensor("embedding", [1, 128])
        g.op(_op("FULLY_CONNECTED"), [x, w, b], [h], g.options("FullyConnectedOptions"),
             "FullyConnectedOptions")
    else:
        x = g.tensor("input", [1, 6, 6, 3])
        h = _conv(g, x, [1, 6, 6, 8], 3, "features")
    y = g.tensor("normalized", g.sub.tensors[h].shape)
    g.op(_op("L2_NORMALIZATION"), [h], [y], g.options("L2NormOptions"), "L2NormOptions")
    return g.finish([x], [y])


def shape_chain(batch_signature: bool = True, seed: int = 0) -> bytes:
    """Keras' dynamic-batch flatten: CONV_2D -> SHAPE -> STRIDED_SLICE (the batch) -> PACK [batch,
    -1] -> RESHAPE -> FULLY_CONNECTED; input 1x6x6x3, batch -1 in its signature when asked."""
    g = Graph(seed)
    sig = [-1, 6, 6, 3] if batch_signature else None
    x = g.tensor("input", [1, 6, 6, 3], signature=sig)
    c = _conv(g, x, [1, 6, 6, 4], 3, "features")
    if batch_signature:
        g.sub.tensors[c].shapeSignature = [-1, 6, 6, 4]
    shape = g.tensor("shape", [4], INT32)
    g.op(_op("SHAPE"), [c], [shape], g.options("ShapeOptions", outType=INT32), "ShapeOptions")
    batch = g.tensor("batch", [], INT32)
    g.op(_op("STRIDED_SLICE"), [shape, *(g.const(n, np.array([v], np.int32)) for n, v in
                                         (("begin", 0), ("end", 1), ("strides", 1)))], [batch],
         g.options("StridedSliceOptions", shrinkAxisMask=1), "StridedSliceOptions")
    new_shape = g.tensor("new_shape", [2], INT32)
    g.op(_op("PACK"), [batch, g.const("rest", np.array(-1, np.int32))], [new_shape],
         g.options("PackOptions", valuesCount=2, axis=0), "PackOptions")
    flat = g.tensor("flat", [1, 144], signature=[-1, 144] if batch_signature else None)
    g.op(_op("RESHAPE"), [c, new_shape], [flat], g.options("ReshapeOptions"), "ReshapeOptions")
    w = g.const("fc_w", g.rng.standard_normal((10, 144)).astype(np.float32) * 0.1)
    b = g.const("fc_b", g.rng.standard_normal(10).astype(np.float32))
    y = g.tensor("logits", [1, 10], signature=[-1, 10] if batch_signature else None)
    g.op(_op("FULLY_CONNECTED"), [flat, w, b], [y], g.options("FullyConnectedOptions"),
         "FullyConnectedOptions")
    return g.finish([x], [y])


def batch(seed: int = 0) -> bytes:
    """CONV_2D (stride 2) -> MEAN over H, W -> FULLY_CONNECTED; input [-1, 8, 8, 3] in its
    signature (shape 1x8x8x3)."""
    g = Graph(seed)
    x = g.tensor("input", [1, 8, 8, 3], signature=[-1, 8, 8, 3])
    c = _conv(g, x, [1, 4, 4, 6], 3, "features", stride=2)
    g.sub.tensors[c].shapeSignature = [-1, 4, 4, 6]
    m = g.tensor("pooled", [1, 6], signature=[-1, 6])
    g.op(_op("MEAN"), [c, g.const("axes", np.array([1, 2], np.int32))], [m],
         g.options("ReducerOptions", keepDims=False), "ReducerOptions")
    w = g.const("fc_w", g.rng.standard_normal((3, 6)).astype(np.float32))
    b = g.const("fc_b", g.rng.standard_normal(3).astype(np.float32))
    y = g.tensor("scores", [1, 3], signature=[-1, 3])
    g.op(_op("FULLY_CONNECTED"), [m, w, b], [y], g.options("FullyConnectedOptions"),
         "FullyConnectedOptions")
    return g.finish([x], [y])


def members() -> list[tuple[str, str, bytes]]:
    """Every member of every family: (family, name, TFLite bytes)."""
    out = []
    for dtype in ("uint8", "int8"):
        for per_channel in ((False,) if dtype == "uint8" else (False, True)):
            for float_io in (False, True):
                name = f"{dtype}{'_per_channel' if per_channel else ''}{'_float_io' if float_io else ''}"
                out.append(("quantized", name, quantized(dtype, per_channel, float_io)))
    for size_in, size_out, align, half in ((8, 16, False, False), (8, 16, False, True),
                                           (9, 17, True, False), (6, 15, False, False),
                                           (6, 15, False, True), (33, 257, True, False)):
        mode = "align_corners" if align else "half_pixel" if half else "asymmetric"
        out.append(("resize", f"{size_in}to{size_out}_{mode}", resize(size_in, size_out, align, half)))
    for d, pad, mult in ((2, SAME, 1), (3, SAME, 1), (2, VALID, 1), (2, SAME, 2)):
        out.append(("dilated", f"d{d}_{'same' if pad == SAME else 'valid'}_m{mult}", dilated(d, pad, mult)))
    out += [("l2norm", "rank2", l2norm(2)), ("l2norm", "rank4", l2norm(4))]
    out += [("shape_chain", "batch_-1", shape_chain(True)), ("shape_chain", "static", shape_chain(False)),
            ("batch", "batch_-1", batch())]
    return out
