"""Graph rewrites an ABI declares as workarounds of a compiler bug (`workarounds:` of an ABI in
pipeline/targets/*.yaml), applied to the static model just before that ABI's compile.

Each rewrite computes the same function with other ops, one the compiler gets right, and says
what it touched. The compile stage records which ran (compile.json, then the manifest), and
validation checks the result like any artifact; tests/e2e/test_workarounds.py shows, per
workaround, that the bug is still there without it (when it is not, the workaround can go).

    depthwise_conv_as_slices   a depthwise Conv as a zero Pad + per kernel tap a
                               strided Slice times a per-channel weight, summed: the same
                               arithmetic as elementwise ops. IREE 3.13's SPIR-V code for
                               vp_android_baseline_2022 computes depthwise convolutions wrong
                               (3x3 and 5x5, strides [2,1] and [1,1]); this form of the 3x3 ones
                               is right there (`depthwise_conv3x3_as_slices`, zero borders by
                               Concat), and on CPUs it is faster than IREE's own depthwise code
                               (a search candidate)
    depthwise_conv_as_slice_chunks
                               the same, a kernel above 3x3 summing its taps in chunks of at
                               most 7 (stacked, then ReduceSum): the one Sum of a 5x5 kernel
                               passes IREE's fusion operand limit and splits badly (for speed)
    depthwise_conv_as_dense    a depthwise Conv as zero borders (Concat) + a dense Conv with
                               block-diagonal weights (C times the arithmetic): right on that
                               target for the 5x5 ones, whose Slice form is wrong
    conv_transpose_as_depth_to_space
                               a ConvTranspose with kernel == stride (the k x k upsampling of
                               FPN/DB heads) as a 1x1 Conv + DepthToSpace: for speed, IREE lowers
                               ConvTranspose as a convolution over a zero-dilated input
    nearest_resize_as_expand   a nearest Resize by whole factors as Reshape + Expand + Reshape:
                               for speed, a broadcast IREE fuses where its Resize is a gather
    strided_conv_as_im2col     a dense Conv with a stride above 1 as Pad + Slices + Concat
                               (im2col) + a 1x1 Conv: for speed, a matrix product
    conv1d_as_matmul           a Conv along one axis (1-D, or 2-D over a 1-pixel-high line) as
                               Pad + Gather (im2col along the line) + a MatMul, a depthwise
                               one as Slices times per-channel weights: for speed,
                               IREE's CPU code for 1-D convolutions is 10-25x onnxruntime's
    pointwise_conv_as_matmul   a 1x1 dense Conv (stride 1, unpadded) as Reshape + MatMul +
                               Reshape: for speed, a matrix product IREE data-tiles

Rewrites for speed are declared in an ABI's `configs:` (candidates the configuration search
builds, validates and times; the pinned winner is what builds apply), workarounds in its
`workarounds:`.
"""
from __future__ import annotations

from pathlib import Path

from .graph_edit import main_opset


def _attr(node, name, default):
    import onnx  # onnx: 1.5 s, not needed by doit list
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def _text(node, name, default: str) -> str:
    value = _attr(node, name, default)
    return value.decode() if isinstance(value, bytes) else value


def _pads(node, x_hw, y_hw, kernel, strides, dilations) -> list[int] | None:
    """[top, left, bottom, right] of a 2-D Conv, explicit or from its auto_pad (None: unknown)."""
    mode = _text(node, "auto_pad", "NOTSET")
    if mode == "NOTSET":
        return list(_attr(node, "pads", [0, 0, 0, 0]))
    if mode == "VALID":
        return [0, 0, 0, 0]
    total = [max((o - 1) * s + (k - 1) * d + 1 - i, 0)
             for i, o, k, s, d in zip(x_hw, y_hw, kernel, strides, dilations)]
    small = [t // 2 for t in total]
    big = [t - h for t, h in zip(total, small)]
    if mode == "SAME_UPPER":
        return [small[0], small[1], big[0], big[1]]
    if mode == "SAME_LOWER":
        return [big[0], big[1], small[0], small[1]]
    return None


class _Conv:
    """One static-shape 2-D Conv of a graph with constant weights, its padding made explicit;
    the nodes replacing it are named after its output and `tag`."""

    def __init__(self, k, node, weight, bias, x_shape, y_shape, pads, tag: str = "dw"):
        self.k, self.node, self.weight, self.bias = k, node, weight, bias
        self.x_shape, self.y_shape, self.pads = x_shape, y_shape, pads
        self.name = node.name or f"node {k}"
        self.prefix = f"{node.output[0]}__{tag}"


def _static_shapes(model) -> dict[str, list[int]]:
    """Every tensor of the graph whose shape ONNX shape inference knows in full."""
    from onnx import shape_inference  # onnx: 1.5 s, not needed by doit list
    known = shape_inference.infer_shapes(model)
    shapes = {}
    for v in list(known.graph.value_info) + list(known.graph.input) + list(known.graph.output):
        dims = [d.dim_value if d.HasField("dim_value") else None for d in v.type.tensor_type.shape.dim]
        if dims and None not in dims:
            shapes[v.name] = dims
    return shapes


def _convs(model, keep, tag: str) -> dict[int, _Conv]:
    """The 2-D Convs the rewrites below can take, by node index: known input and output shapes,
    constant weights (and bias), known padding, and `keep(weight, group, x_shape)`."""
    from onnx import numpy_helper  # onnx: 1.5 s, not needed by doit list
    shapes = _static_shapes(model)
    inits = {i.name: i for i in model.graph.initializer}
    found = {}
    for k, node in enumerate(model.graph.node):
        if node.op_type != "Conv" or len(node.input) < 2 or node.input[1] not in inits:
            continue
        weight = numpy_helper.to_array(inits[node.input[1]])
        has_bias = len(node.input) > 2 and node.input[2]
        bias = numpy_helper.to_array(inits[node.input[2]]) if has_bias and node.input[2] in inits else None
        x_shape, y_shape = shapes.get(node.input[0]), shapes.get(node.output[0])
        if (x_shape is None or y_shape is None or len(x_shape) != 4 or weight.ndim != 4
                or (has_bias and bias is None) or not keep(weight, _attr(node, "group", 1), x_shape)):
            continue
        pads = _pads(node, x_shape[2:], y_shape[2:], weight.shape[2:], _attr(node, "strides", [1, 1]),
                     _attr(node, "dilations", [1, 1]))
        if pads is not None:
            found[k] = _Conv(k, node, weight, bias, x_shape, y_shape, pads, tag)
    return found


def _depthwise_convs(model, max_kernel: int | None = None) -> dict[int, _Conv]:
    """The depthwise Convs (group == channels, one filter each), kernels at most max_kernel wide."""
    return _convs(model, lambda w, group, x: (w.shape[1] == 1 and group != 1 and group == x[1] == w.shape[0]
                                              and not (max_kernel and max(w.shape[2:]) > max_kernel)), "dw")


def _zero_borders(conv: _Conv, nodes: list, const) -> str:
    """Append the Concats that put conv's zero padding around its input; returns the padded
    tensor's name. Concat, not Pad (nor the Conv's own pads): IREE 3.13 fuses a padding into its
    producer's store and gets the offsets wrong on the Vulkan targets (the pad-fusion bug of
    docs/vulkan.md; cls's 5x5 depthwise Conv after a Div, `doit bisect`)."""
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    from onnx import helper  # onnx: 1.5 s, not needed by doit list
    pt, pl, pb, pr = conv.pads
    padded, size = conv.node.input[0], list(conv.x_shape)
    for axis, before, after in ((2, pt, pb), (3, pl, pr)):
        if not (before or after):
            continue
        parts = []
        if before:
            parts.append(const(f"{conv.prefix}_zero{axis}b",
                               np.zeros([*size[:axis], before, *size[axis + 1:]], conv.weight.dtype)))
        parts.append(padded)
        if after:
            parts.append(const(f"{conv.prefix}_zero{axis}a",
                               np.zeros([*size[:axis], after, *size[axis + 1:]], conv.weight.dtype)))
        out = f"{conv.prefix}_padded{axis}"
        nodes.append(helper.make_node("Concat", parts, [out], name=f"{conv.name}__pad{axis}", axis=axis))
        padded, size[axis] = out, size[axis] + before + after
    return padded


def _pad(conv: _Conv, nodes: list, const) -> str:
    """Append one Pad (constant zeros) of conv's padding around its input; returns the padded
    tensor's name. On CPUs IREE fuses it into the consumers, where the Concat of _zero_borders
    is a copy (slow_memcpy: 13 % of ppocr_cls's time, `doit profile`)."""
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    from onnx import helper  # onnx: 1.5 s, not needed by doit list
    if not any(conv.pads):
        return conv.node.input[0]
    pt, pl, pb, pr = conv.pads
    pads = const(f"{conv.prefix}_pads", np.array([0, 0, pt, pl, 0, 0, pb, pr], np.int64))
    nodes.append(helper.make_node("Pad", [conv.node.input[0], pads], [f"{conv.prefix}_padded"],
                                  name=f"{conv.name}__pad", mode="constant"))
    return f"{conv.prefix}_padded"


def _rewrite_convs(model, found: dict, replace, borders=_zero_borders) -> list[str]:
    """Replace each Conv of `found` by `replace(conv, padded_input, nodes, const)`, which
    appends the nodes that compute conv.node.output[0], its input padded by `borders`; returns
    the names of those replaced."""
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    from onnx import numpy_helper  # onnx: 1.5 s, not needed by doit list
    if not found:
        return []
    nodes, consts = [], []

    def const(name, array):
        consts.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    for k, node in enumerate(model.graph.node):
        if k in found:
            replace(found[k], borders(found[k], nodes, const), nodes, const)
        else:
            nodes.append(node)
    _install(model, nodes, consts)
    return [found[k].name for k in sorted(found)]


def _install(model, nodes: list, consts: list) -> None:
    """The graph's nodes become `nodes`, `consts` join its initializers, the initializers no node
    reads any more are dropped, and the model is checked."""
    import onnx  # onnx: 1.5 s, not needed by doit list
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    model.graph.initializer.extend(consts)
    used = {i for n in model.graph.node for i in n.input}
    keep = [i for i in model.graph.initializer if i.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(keep)
    onnx.checker.check_model(model)


def depthwise_conv_as_dense(model) -> list[str]:
    """Rewrite every depthwise 2-D Conv (group == channels, one filter per channel) as zero
    borders (Concat) + an unpadded dense Conv (group 1) whose weights are zero off the
    diagonal: the same numbers, channels times the arithmetic. Returns the names of those
    rewritten."""
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    from onnx import helper  # onnx: 1.5 s, not needed by doit list

    def dense(conv, padded, nodes, const):
        c = conv.weight.shape[0]
        weight = np.zeros((c, c) + conv.weight.shape[2:], conv.weight.dtype)
        weight[np.arange(c), np.arange(c)] = conv.weight[:, 0]
        inputs = [padded, const(f"{conv.prefix}_dense", weight)]
        if conv.bias is not None:
            inputs.append(const(f"{conv.prefix}_bias", conv.bias))
        nodes.append(helper.make_node(
            "Conv", inputs, list(conv.node.output), name=f"{conv.name}__dense",
            kernel_shape=list(conv.weight.shape[2:]), strides=list(_attr(conv.node, "strides", [1, 1])),
            dilations=list(_attr(conv.node, "dilations", [1, 1]))))
    return _rewrite_convs(model, _depthwise_convs(model), dense)


def _taps(conv: _Conv, padded: str, nodes: list, const):
    """Per kernel tap (i, j), in row-major order: append the strided Slice of the padded input
    that the tap's weight multiplies at every output pixel, and yield ((i, j), its name)."""
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    from onnx import helper  # onnx: 1.5 s, not needed by doit list
    kh, kw = conv.weight.shape[2:]
    sh, sw = _attr(conv.node, "strides", [1, 1])
    dh, dw = _attr(conv.node, "dilations", [1, 1])
    oh, ow = conv.y_shape[2:]
    axes = const(f"{conv.prefix}_axes", np.array([2, 3], np.int64))
    steps = const(f"{conv.prefix}_steps", np.array([sh, sw], np.int64))
    for i in range(kh):
        for j in range(kw):
            top, left, tap = i * dh, j * dw, f"{conv.prefix}_tap{i}_{j}"
            starts = const(f"{tap}_starts", np.array([top, left], np.int64))
            ends = const(f"{tap}_ends", np.array([top + (oh - 1) * sh + 1, left + (ow - 1) * sw + 1], np.int64))
            nodes.append(helper.make_node("Slice", [padded, starts, ends, axes, steps], [tap],
                                          name=f"{conv.name}__tap{i}_{j}"))
            yield (i, j), tap


def _weighted_taps(conv: _Conv, padded: str, nodes: list, const) -> list[str]:
    """Per kernel tap its strided Slice of the padded input times the tap's per-channel weight
    (Mul), then the bias if any: the terms whose sum is the depthwise conv's output."""
    from onnx import helper  # onnx: 1.5 s, not needed by doit list
    c = conv.weight.shape[0]
    terms = []
    for (i, j), tap in _taps(conv, padded, nodes, const):
        scale = const(f"{tap}_w", conv.weight[:, 0, i, j].reshape(1, c, 1, 1))
        nodes.append(helper.make_node("Mul", [tap, scale], [f"{tap}_x"], name=f"{conv.name}__mul{i}_{j}"))
        terms.append(f"{tap}_x")
    if conv.bias is not None:
        terms.append(const(f"{conv.prefix}_bias", conv.bias.reshape(1, c, 1, 1)))
    return terms


def depthwise_conv_as_slices(model, max_kernel: int | None = None, borders=_pad) -> list[str]:
    """Rewrite every depthwise 2-D Conv (with a kernel at most max_kernel wide) as its input
    padded with zeros (a Pad; `borders`) + one strided Slice times a per-channel weight per
    kernel tap + Sum (+ bias): the same arithmetic as the Conv, as elementwise ops. Returns the
    names of those rewritten."""
    from onnx import helper  # onnx: 1.5 s, not needed by doit list

    def slices(conv, padded, nodes, const):
        nodes.append(helper.make_node("Sum", _weighted_taps(conv, padded, nodes, const),
                                      list(conv.node.output), name=f"{conv.name}__sum"))
    return _rewrite_convs(model, _depthwise_convs(model, max_kernel), slices, borders)


# IREE 3.13 fuses elementwise ops into one only while the result has at most 16 operands
# (kIreeMaxOperandCount); a tap brings two, its Slice and its per-channel weight.
_TERMS_PER_CHUNK = 7


def depthwise_conv_as_slice_chunks(model) -> list[str]:
    """depthwise_conv_as_slices, except that a kernel larger than 3x3 sums its terms in chunks
    of at most 7 (a Sum each), stacked on a new leading axis (Unsqueeze, Concat) and added up
    there (ReduceSum): IREE splits the 25 terms of a 5x5 kernel's single Sum by its operand
    limit into 11 dispatches, 9 of them a lone tap written out and read back (ppocr_det's
    Conv.78: 17 ms against 1.3 ms in onnxruntime); the chunks are 4 dispatches and a reduction
    (8 ms on their own). 3x3 kernels keep the single Sum: chunked they were slower
    (face_landmark 0.72x -> 1.05x of onnxruntime). Returns the names of those rewritten."""
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    from onnx import helper  # onnx: 1.5 s, not needed by doit list
    axes_as_input = main_opset(model) >= 13  # Unsqueeze and ReduceSum take axes as an input

    def chunks(conv, padded, nodes, const):
        terms = _weighted_taps(conv, padded, nodes, const)
        if max(conv.weight.shape[2:]) <= 3:
            nodes.append(helper.make_node("Sum", terms, list(conv.node.output), name=f"{conv.name}__sum"))
            return
        n = -(-len(terms) // _TERMS_PER_CHUNK)
        size = -(-len(terms) // n)  # n chunks of about the same size
        axis = [const(f"{conv.prefix}_axis0", np.array([0], np.int64))] if axes_as_input else []
        attrs = {} if axes_as_input else {"axes": [0]}
        stacked = []
        for g in range(n):
            part = f"{conv.prefix}_part{g}"
            nodes.append(helper.make_node("Sum", terms[g * size:(g + 1) * size], [part],
                                          name=f"{conv.name}__part{g}"))
            nodes.append(helper.make_node("Unsqueeze", [part, *axis], [f"{part}_1"],
                                          name=f"{conv.name}__stack{g}", **attrs))
            stacked.append(f"{part}_1")
        nodes.append(helper.make_node("Concat", stacked, [f"{conv.prefix}_parts"], axis=0,
                                      name=f"{conv.name}__parts"))
        nodes.append(helper.make_node("ReduceSum", [f"{conv.prefix}_parts", *axis],
                                      list(conv.node.output), name=f"{conv.name}__sum", keepdims=0, **attrs))
    return _rewrite_convs(model, _depthwise_convs(model), chunks, _pad)


def strided_conv_as_im2col(model) -> list[str]:
    """Rewrite every dense (group 1) 2-D Conv with a kernel larger than 1x1 and a stride above 1
    as its input padded with zeros (a Pad) + one strided Slice per kernel tap, concatenated on
    channels (im2col, in the graph) + a 1x1 Conv over them (Cin * kh * kw channels): a matrix
    product IREE tiles well. IREE 3.13's own code for a strided NCHW convolution is its slowest
    (ppocr_det: the 3x3 stride-2 Conv.3 30 ms, 6.8x onnxruntime's, `doit profile`); the same
    im2col for every dense Conv costs more in copies than it saves (the flag
    --iree-global-opt-use-im2col-for-convs: 2.8x). Returns the names of those rewritten."""
    from onnx import helper  # onnx: 1.5 s, not needed by doit list

    def im2col(conv, padded, nodes, const):
        o, c, kh, kw = conv.weight.shape
        taps = [tap for _, tap in _taps(conv, padded, nodes, const)]
        nodes.append(helper.make_node("Concat", taps, [f"{conv.prefix}_cols"], name=f"{conv.name}__cols",
                                      axis=1))
        # channel (i * kw + j) * c + ci of the columns is tap (i, j) of input channel ci
        weight = conv.weight.transpose(0, 2, 3, 1).reshape(o, kh * kw * c, 1, 1)
        inputs = [f"{conv.prefix}_cols", const(f"{conv.prefix}_w", weight)]
        if conv.bias is not None:
            inputs.append(const(f"{conv.prefix}_b", conv.bias))
        nodes.append(helper.make_node("Conv", inputs, list(conv.node.output), name=f"{conv.name}__1x1",
                                      kernel_shape=[1, 1]))
    strided = _convs(model, lambda w, group, x: group == 1 and max(w.shape[2:]) > 1, "col")
    strided = {k: c for k, c in strided.items() if max(_attr(c.node, "strides", [1, 1])) > 1}
    return _rewrite_convs(model, strided, im2col, _pad)


def _line_pads(node, size: int, out: int, kernel: int, stride: int, dilation: int,
               axis: int, rank: int) -> tuple[int, int] | None:
    """(before, after) padding of a Conv along spatial `axis` (0-based, of `rank` spatial axes),
    explicit or from its auto_pad (None: unknown)."""
    mode = _text(node, "auto_pad", "NOTSET")
    if mode == "NOTSET":
        pads = list(_attr(node, "pads", [0] * 2 * rank))
        return pads[axis], pads[rank + axis]
    if mode == "VALID":
        return 0, 0
    total = max((out - 1) * stride + (kernel - 1) * dilation + 1 - size, 0)
    small, big = total // 2, total - total // 2
    return {"SAME_UPPER": (small, big), "SAME_LOWER": (big, small)}.get(mode)


class _Line:
    """A Conv along one axis (a 1-D Conv on [N, C, L], or a 2-D one on [N, C, 1, L] or
    [N, C, L, 1] whose kernel is 1 across the unit axis): the axis, its taps and padding."""

    def __init__(self, k, node, weight, bias, x_shape, y_shape, axis, pads):
        self.k, self.node, self.weight, self.bias = k, node, weight, bias
        self.x_shape, self.y_shape, self.axis, self.pads = x_shape, y_shape, axis, pads
        rank = len(x_shape) - 2
        spatial = axis - 2
        self.taps = weight.shape[axis]
        self.stride = list(_attr(node, "strides", [1] * rank))[spatial]
        self.dilation = list(_attr(node, "dilations", [1] * rank))[spatial]
        self.group = _attr(node, "group", 1)
        self.name = node.name or f"node {k}"
        self.prefix = f"{node.output[0]}__line"


# A depthwise one is a Slice, a Mul and a Sum term per tap: at most this many taps.
_MAX_LINE_TAPS = 32


def _line_convs(model) -> dict[int, _Line]:
    """The Convs along one axis the rewrite below takes, by node index: constant weights (and
    bias), known input and output shapes and padding (a depthwise one: at most _MAX_LINE_TAPS taps)."""
    from onnx import numpy_helper  # onnx: 1.5 s, not needed by doit list
    shapes = _static_shapes(model)
    inits = {i.name: i for i in model.graph.initializer}
    found = {}
    for k, node in enumerate(model.graph.node):
        if node.op_type != "Conv" or len(node.input) < 2 or node.input[1] not in inits:
            continue
        weight = numpy_helper.to_array(inits[node.input[1]])
        has_bias = len(node.input) > 2 and node.input[2]
        bias = numpy_helper.to_array(inits[node.input[2]]) if has_bias and node.input[2] in inits else None
        x, y = shapes.get(node.input[0]), shapes.get(node.output[0])
        if x is None or y is None or len(x) not in (3, 4) or weight.ndim != len(x) or (has_bias and bias is None):
            continue
        rank = len(x) - 2
        kernel = weight.shape[2:]
        strides = list(_attr(node, "strides", [1] * rank))
        dilations = list(_attr(node, "dilations", [1] * rank))
        pads = [_line_pads(node, x[2 + a], y[2 + a], kernel[a], strides[a], dilations[a], a, rank)
                for a in range(rank)]
        if None in pads:
            continue
        # the one axis the Conv slides along: the other (2-D) has extent 1, kernel 1, no padding
        unit = [a for a in range(rank) if x[2 + a] == 1 and y[2 + a] == 1 and kernel[a] == 1
                and pads[a] == (0, 0)]
        if rank == 1:
            axis = 0
        elif len(unit) >= 1:
            axis = 1 if unit[0] == 0 else 0
        else:
            continue
        group = _attr(node, "group", 1)
        if group > 1 and weight.shape[1] == 1 and weight.shape[0] == group and kernel[axis] > _MAX_LINE_TAPS:
            continue
        found[k] = _Line(k, node, weight, bias, x, y, 2 + axis, pads[axis])
    return found


def conv1d_as_matmul(model) -> list[str]:
    """Rewrite every Conv along one axis (1-D Convs on [N, C, L]; 2-D ones on [N, C, 1, L] or
    [N, C, L, 1] with a kernel of 1 across the unit axis, as TensorFlow's conv1d exports) as its
    input padded with zeros (a Pad) + the columns by one Gather of the line with a constant
    [L_out, taps] index (im2col along the line) + Transpose + one MatMul by the weights as a
    [taps * C_in, C_out] matrix (per group: a batched MatMul), + the bias, + Transpose back. A
    depthwise one (one input and one output channel per group, at most _MAX_LINE_TAPS taps)
    becomes per tap a strided Slice times a per-channel weight, summed. IREE 3.13 lowers a 1-D
    convolution (and a 2-D one over a 1-pixel-high image) to a generic op its CPU backend
    neither data-tiles nor vectorizes well: gen_conv1d 12.5 ms against onnxruntime's 0.5 ms,
    all of it in the three conv dispatches; as data-tiled matrix products 1.5 ms (a Slice per
    tap + Concat; the Gather is faster still, and compiles a 512-tap STFT in 9 s where the
    Concat took over 120 s: docs/measurements/2026-12-03-conv1d.md). Returns the names of those
    rewritten."""
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    from onnx import helper, numpy_helper  # onnx: 1.5 s, not needed by doit list
    found = _line_convs(model)
    if not found:
        return []
    pad_input = main_opset(model) >= 11  # Pad takes its pads as an input
    nodes, consts = [], []

    def const(name, array):
        consts.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    for k, node in enumerate(model.graph.node):
        if k not in found:
            nodes.append(node)
            continue
        line = found[k]
        p, rank = line.prefix, len(line.x_shape)
        n, c, size = line.x_shape[0], line.x_shape[1], line.x_shape[line.axis]
        out = line.y_shape[line.axis]
        o, taps, g = line.weight.shape[0], line.taps, line.group
        cg, og = c // g, o // g
        x = node.input[0]
        if any(line.pads):
            pads = [0] * (2 * rank)
            pads[line.axis], pads[rank + line.axis] = line.pads
            if pad_input:
                nodes.append(helper.make_node("Pad", [x, const(f"{p}_pads", np.array(pads, np.int64))],
                                              [f"{p}_padded"], name=f"{line.name}__pad", mode="constant"))
            else:
                nodes.append(helper.make_node("Pad", [x], [f"{p}_padded"], name=f"{line.name}__pad",
                                              mode="constant", pads=pads))
            x = f"{p}_padded"
        w = line.weight.reshape(g, og, cg, taps)  # the unit axis, if any, dropped
        if cg == 1 and og == 1 and g > 1:  # depthwise: per tap a per-channel weight, summed
            axes = const(f"{p}_axes", np.array([line.axis], np.int64))
            steps = const(f"{p}_steps", np.array([line.stride], np.int64))
            shape = [1] * rank
            shape[1] = c
            terms = []
            for j in range(taps):
                start = j * line.dilation
                nodes.append(helper.make_node(
                    "Slice", [x, const(f"{p}_start{j}", np.array([start], np.int64)),
                              const(f"{p}_end{j}", np.array([start + (out - 1) * line.stride + 1], np.int64)),
                              axes, steps], [f"{p}_tap{j}"], name=f"{line.name}__tap{j}"))
                nodes.append(helper.make_node("Mul", [f"{p}_tap{j}", const(f"{p}_w{j}", w[:, 0, 0, j].reshape(shape))],
                                              [f"{p}_term{j}"], name=f"{line.name}__mul{j}"))
                terms.append(f"{p}_term{j}")
            if line.bias is not None:
                terms.append(const(f"{p}_b", line.bias.reshape(shape)))
            # IREE fuses at most 16 operands (two a term): Sums of at most 7, then their Sum
            parts = [terms[i:i + _TERMS_PER_CHUNK] for i in range(0, len(terms), _TERMS_PER_CHUNK)]
            if len(parts) > 1:
                for i, part in enumerate(parts):
                    nodes.append(helper.make_node("Sum", part, [f"{p}_part{i}"], name=f"{line.name}__part{i}"))
                terms = [f"{p}_part{i}" for i in range(len(parts))]
            nodes.append(helper.make_node("Sum", terms, list(node.output), name=f"{line.name}__sum"))
            continue
        # the columns by one Gather of the padded line: cols[n, c, t, j] = x[n, c, t * stride + j * dilation]
        # (one Slice per tap and a Concat: 2.5x slower on gen_conv1d, and a 512-tap STFT's Concat
        # took iree-compile past 120 s)
        padded = size + sum(line.pads)
        if rank == 4:
            nodes.append(helper.make_node("Reshape", [x, const(f"{p}_line", np.array([n, c, padded], np.int64))],
                                          [f"{p}_x3"], name=f"{line.name}__line"))
            x = f"{p}_x3"
        index = np.arange(out)[:, None] * line.stride + np.arange(taps)[None, :] * line.dilation
        nodes.append(helper.make_node("Gather", [x, const(f"{p}_index", index.astype(np.int64))],
                                      [f"{p}_gathered"], name=f"{line.name}__cols", axis=2))
        # rows (n, t) of group gi, columns (ci, j): [g, n * out, cg * taps] (no g axis when g == 1)
        if g == 1:
            nodes.append(helper.make_node("Transpose", [f"{p}_gathered"], [f"{p}_cols_t"],
                                          name=f"{line.name}__cols_t", perm=[0, 2, 1, 3]))
            flat = [n * out, c * taps]
        else:
            nodes.append(helper.make_node("Reshape", [f"{p}_gathered", const(f"{p}_groups", np.array(
                [n, g, cg, out, taps], np.int64))], [f"{p}_grouped"], name=f"{line.name}__groups"))
            nodes.append(helper.make_node("Transpose", [f"{p}_grouped"], [f"{p}_cols_t"],
                                          name=f"{line.name}__cols_t", perm=[1, 0, 3, 2, 4]))
            flat = [g, n * out, cg * taps]
        nodes.append(helper.make_node("Reshape", [f"{p}_cols_t", const(f"{p}_flat", np.array(flat, np.int64))],
                                      [f"{p}_cols"], name=f"{line.name}__cols_shape"))
        weight = np.ascontiguousarray(w.transpose(0, 2, 3, 1).reshape(g, cg * taps, og))
        nodes.append(helper.make_node("MatMul", [f"{p}_cols", const(f"{p}_w", weight if g > 1 else weight[0])],
                                      [f"{p}_mm"], name=f"{line.name}__matmul"))
        result = f"{p}_mm"
        if line.bias is not None:
            bias = line.bias.reshape(g, 1, og) if g > 1 else line.bias.reshape(1, o)
            nodes.append(helper.make_node("Add", [result, const(f"{p}_b", bias)], [f"{p}_biased"],
                                          name=f"{line.name}__bias"))
            result = f"{p}_biased"
        # [g, n * out, og] -> [n, g, og, out] -> the output's shape
        nodes.append(helper.make_node("Reshape", [result, const(f"{p}_rows", np.array([g, n, out, og], np.int64))],
                                      [f"{p}_rows4"], name=f"{line.name}__rows"))
        nodes.append(helper.make_node("Transpose", [f"{p}_rows4"], [f"{p}_nc"], name=f"{line.name}__nc",
                                      perm=[1, 0, 3, 2]))
        nodes.append(helper.make_node("Reshape", [f"{p}_nc", const(f"{p}_out", np.array(line.y_shape, np.int64))],
                                      list(node.output), name=f"{line.name}__out"))
    _install(model, nodes, consts)
    return [found[k].name for k in sorted(found)]


def pointwise_conv_as_matmul(model) -> list[str]:
    """Rewrite every 1x1 dense 2-D Conv (stride 1, unpadded) as Reshape to [C, H * W] + one MatMul
    by the weights as a [C_out, C] matrix (+ the bias) + Reshape back. IREE 3.13 keeps such a
    Conv in NCHW as a 4-D matmul-like generic op that data tiling does not reach unless the
    dispatch collapses H and W (gen_depthwise: the 64x56x56x64 pointwise Conv 5.0 ms alone,
    the last one, collapsed and data-tiled, 0.8 ms for 1.5x the work). Returns the names of
    those rewritten."""
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    from onnx import helper  # onnx: 1.5 s, not needed by doit list

    def matmul(conv, _, nodes, const):
        n, c, h, w = conv.x_shape
        o = conv.weight.shape[0]
        flat = const(f"{conv.prefix}_flat", np.array([c, h * w] if n == 1 else [n, c, h * w], np.int64))
        nodes.append(helper.make_node("Reshape", [conv.node.input[0], flat], [f"{conv.prefix}_x"],
                                      name=f"{conv.name}__flat"))
        weight = const(f"{conv.prefix}_w", conv.weight.reshape(o, c))
        nodes.append(helper.make_node("MatMul", [weight, f"{conv.prefix}_x"], [f"{conv.prefix}_mm"],
                                      name=f"{conv.name}__matmul"))
        result = f"{conv.prefix}_mm"
        if conv.bias is not None:
            nodes.append(helper.make_node("Add", [result, const(f"{conv.prefix}_b", conv.bias.reshape(o, 1))],
                                          [f"{conv.prefix}_biased"], name=f"{conv.name}__bias"))
            result = f"{conv.prefix}_biased"
        shape = const(f"{conv.prefix}_out", np.array(conv.y_shape, np.int64))
        nodes.append(helper.make_node("Reshape", [result, shape], list(conv.node.output), name=f"{conv.name}__out"))
    found = _convs(model, lambda w, group, x: group == 1 and list(w.shape[2:]) == [1, 1], "pw")
    found = {k: c for k, c in found.items() if not any(c.pads)
             and list(_attr(c.node, "strides", [1, 1])) == [1, 1] and c.y_shape[2:] == c.x_shape[2:]}
    return _rewrite_convs(model, found, matmul, lambda conv, nodes, const: conv.node.input[0])


def depthwise_conv3x3_as_slices(model) -> list[str]:
    """depthwise_conv_as_slices for kernels up to 3x3: on vp_android_baseline_2022 the Slice form
    of a 5x5 one is wrong too at stride 1 in W (lavapipe and an NVIDIA H200, IREE 3.13). Borders
    by Concat: a Pad meets the pad-fusion bug there."""
    return depthwise_conv_as_slices(model, max_kernel=3, borders=_zero_borders)


def conv_transpose_as_depth_to_space(model) -> list[str]:
    """Rewrite every ConvTranspose whose kernel equals its strides (k x k, stride k: the 2x
    upsampling of FPN/DB heads), unpadded, ungrouped and undilated, as a 1x1 Conv to O*k*k
    channels followed by DepthToSpace (DCR, blocksize k): each output pixel takes exactly one
    input pixel, so out[o, i*k+a, j*k+b] = sum_c x[c, i, j] W[c, o, a, b] + b[o] is a matrix
    product and a shuffle. IREE 3.13 lowers the ConvTranspose as a strided convolution over
    an input dilated with zeros (ppocr_det: 22 % of its time, against 2.4 % in onnxruntime,
    `doit profile`). Returns the names of those rewritten."""
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    from onnx import helper, numpy_helper  # onnx: 1.5 s, not needed by doit list

    inits = {i.name: i for i in model.graph.initializer}
    uses = {}
    for n in model.graph.node:
        for i in n.input:
            uses[i] = uses.get(i, 0) + 1
    done, nodes = [], []
    for k, node in enumerate(model.graph.node):
        w = inits.get(node.input[1]) if node.op_type == "ConvTranspose" and len(node.input) > 1 else None
        bias = inits.get(node.input[2]) if w is not None and len(node.input) > 2 and node.input[2] else None
        weight = numpy_helper.to_array(w) if w is not None else None
        if (weight is None or weight.ndim != 4 or uses.get(node.input[1], 0) != 1
                or (len(node.input) > 2 and node.input[2] and (bias is None or uses.get(node.input[2], 0) != 1))):
            nodes.append(node)
            continue
        size = weight.shape[2]
        plain = (weight.shape[3] == size and _attr(node, "group", 1) == 1
                 and list(_attr(node, "strides", [1, 1])) == [size, size]
                 and list(_attr(node, "kernel_shape", [size, size])) == [size, size]
                 and not any(_attr(node, "pads", [0, 0, 0, 0]))
                 and not any(_attr(node, "output_padding", [0, 0]))
                 and list(_attr(node, "dilations", [1, 1])) == [1, 1]
                 and _attr(node, "auto_pad", b"NOTSET") in (b"NOTSET", "NOTSET")
                 and not _attr(node, "output_shape", None))
        if not plain or size < 2:
            nodes.append(node)
            continue
        c, o = weight.shape[:2]
        # DCR order, channel (a*k + b)*O + o: IREE 3.13 imports DepthToSpace mode=CRD as if it
        # were DCR (max abs 5.4 on a lone op), DCR right (tests/e2e/test_speed_rewrites.py)
        dense = np.ascontiguousarray(weight.transpose(2, 3, 1, 0).reshape(size * size * o, c, 1, 1))
        w.CopyFrom(numpy_helper.from_array(dense, w.name))
        inputs = [node.input[0], w.name]
        if bias is not None:
            b = numpy_helper.to_array(bias)
            bias.CopyFrom(numpy_helper.from_array(np.tile(b, size * size), bias.name))
            inputs.append(bias.name)
        name = node.name or f"node {k}"
        mid = f"{node.output[0]}__as_depth_to_space"
        nodes.append(helper.make_node("Conv", inputs, [mid], name=f"{name}__conv1x1",
                                      kernel_shape=[1, 1]))
        nodes.append(helper.make_node("DepthToSpace", [mid], list(node.output),
                                      name=f"{name}__depth_to_space", blocksize=size, mode="DCR"))
        done.append(name)
    if done:
        del model.graph.node[:]
        model.graph.node.extend(nodes)
    return done


# nearest Resize modes whose source index of output i is floor(i / s) at an integer scale s:
# asymmetric i/s floored; half_pixel (i + 0.5)/s - 0.5 = q + (r + 0.5)/s - 0.5 for i = q*s + r,
# whose fraction lies strictly inside (-0.5, 0.5), so either rounding gives q
_NEAREST_FLOOR = {("asymmetric", "floor"), ("half_pixel", "round_prefer_floor"),
                  ("half_pixel", "round_prefer_ceil"), ("pytorch_half_pixel", "round_prefer_floor"),
                  ("pytorch_half_pixel", "round_prefer_ceil")}


def nearest_resize_as_expand(model) -> list[str]:
    """Rewrite every nearest-neighbour Resize that repeats each element a whole number of times
    per axis (the x2/x4/x8 upsampling of FPN heads) as Reshape (a unit axis after each one) +
    Expand (the unit axes to the factors) + Reshape: the same elements, copied, which IREE turns
    into a broadcast fused into the consumer where its Resize is a gather (ppocr_det: 6 Resizes).
    Modes other than those of _NEAREST_FLOOR, fractional or shrinking factors and unknown shapes
    are left alone. Returns the names of those rewritten."""
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    from onnx import helper, numpy_helper  # onnx: 1.5 s, not needed by doit list
    shapes = _static_shapes(model)
    done, nodes, consts = [], [], []
    for k, node in enumerate(model.graph.node):
        x = shapes.get(node.input[0]) if node.op_type == "Resize" else None
        y = shapes.get(node.output[0]) if x is not None else None
        if (y is None or len(x) != len(y) or _text(node, "mode", "nearest") != "nearest"
                or (_text(node, "coordinate_transformation_mode", "half_pixel"),
                    _text(node, "nearest_mode", "round_prefer_floor")) not in _NEAREST_FLOOR
                or any(b < a or b % a for a, b in zip(x, y)) or x == y):
            nodes.append(node)
            continue
        name, prefix = node.name or f"node {k}", f"{node.output[0]}__nearest"
        factors = [b // a for a, b in zip(x, y)]
        for suffix, dims in (("split", [d for a in x for d in (a, 1)]),
                             ("repeat", [d for a, f in zip(x, factors) for d in (a, f)]), ("out", y)):
            consts.append(numpy_helper.from_array(np.array(dims, np.int64), f"{prefix}_{suffix}"))
        nodes.append(helper.make_node("Reshape", [node.input[0], f"{prefix}_split"], [f"{prefix}_a"],
                                      name=f"{name}__split"))
        nodes.append(helper.make_node("Expand", [f"{prefix}_a", f"{prefix}_repeat"], [f"{prefix}_b"],
                                      name=f"{name}__expand"))
        nodes.append(helper.make_node("Reshape", [f"{prefix}_b", f"{prefix}_out"], list(node.output),
                                      name=f"{name}__merge"))
        done.append(name)
    if done:
        del model.graph.node[:]
        model.graph.node.extend(nodes)
        model.graph.initializer.extend(consts)
    return done


REWRITES = {"depthwise_conv_as_dense": depthwise_conv_as_dense,
            "depthwise_conv3x3_as_slices": depthwise_conv3x3_as_slices,
            "depthwise_conv_as_slices": depthwise_conv_as_slices,
            "depthwise_conv_as_slice_chunks": depthwise_conv_as_slice_chunks,
            "conv_transpose_as_depth_to_space": conv_transpose_as_depth_to_space,
            "nearest_resize_as_expand": nearest_resize_as_expand,
            "strided_conv_as_im2col": strided_conv_as_im2col,
            "conv1d_as_matmul": conv1d_as_matmul,
            "pointwise_conv_as_matmul": pointwise_conv_as_matmul}


def rewritten(model, names) -> tuple[bytes, list[dict]]:
    """`model` (an onnx ModelProto, changed in place) rewritten by `names` in order: its bytes as
    the compile stage writes them, and what each rewrite touched."""
    done = [{"rewrite": name, "nodes": REWRITES[name](model)} for name in names]
    return model.SerializeToString(deterministic=True), done


def apply(source: Path, names: list[str], dest: Path) -> list[dict]:
    """Write `source` rewritten by `names` (in order) to `dest`; returns what each touched."""
    import onnx  # onnx: 1.5 s, not needed by doit list
    data, done = rewritten(onnx.load(str(source)), names)
    dest.write_bytes(data)
    return done
