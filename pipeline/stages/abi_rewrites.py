"""Graph rewrites an ABI declares as workarounds of a compiler bug (`workarounds:` of an ABI in
pipeline/targets/*.yaml), applied to the static model just before that ABI's compile.

Each rewrite computes the same function with other ops, one the compiler gets right, and says
what it touched. The compile stage records which ran (compile.json, then the manifest), and
validation checks the result like any artifact; tests/e2e/test_workarounds.py shows, per
workaround, that the bug is still there without it (when it is not, the workaround can go).

    depthwise_conv_as_dense    a depthwise Conv as a dense Conv with block-diagonal weights (C
                               times the arithmetic): IREE 3.13's SPIR-V code for
                               vp_android_baseline_2022 computes depthwise convolutions wrong
                               (3x3 and 5x5, strides [2,1] and [1,1]); its dense convs are right
    conv_transpose_as_depth_to_space
                               a ConvTranspose with kernel == stride (the k x k upsampling of
                               FPN/DB heads) as a 1x1 Conv + DepthToSpace: for speed, IREE lowers
                               ConvTranspose as a convolution over a zero-dilated input

Rewrites for speed are declared in an ABI's `configs:` (candidates the configuration search
builds, validates and times; the pinned winner is what builds apply), workarounds in its
`workarounds:`.
"""
from __future__ import annotations

from pathlib import Path


def _attr(node, name, default):
    import onnx
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def depthwise_conv_as_dense(model) -> list[str]:
    """Rewrite every depthwise 2-D Conv (group == channels, one filter per channel) as a dense
    Conv (group 1) whose weights are zero off the diagonal: the same numbers, channels times the
    arithmetic. Returns the names of those rewritten."""
    import numpy as np
    from onnx import numpy_helper

    inits = {i.name: i for i in model.graph.initializer}
    uses = {}
    for n in model.graph.node:
        for i in n.input:
            uses[i] = uses.get(i, 0) + 1
    done = []
    for k, node in enumerate(model.graph.node):
        w = inits.get(node.input[1]) if node.op_type == "Conv" and len(node.input) > 1 else None
        if w is None or uses.get(node.input[1], 0) != 1:
            continue
        weight = numpy_helper.to_array(w)
        group = _attr(node, "group", 1)
        if weight.ndim != 4 or weight.shape[1] != 1 or group != weight.shape[0] or group == 1:
            continue
        c = weight.shape[0]
        dense = np.zeros((c, c) + weight.shape[2:], weight.dtype)
        dense[np.arange(c), np.arange(c)] = weight[:, 0]
        w.CopyFrom(numpy_helper.from_array(dense, w.name))
        for a in node.attribute:
            if a.name == "group":
                a.i = 1
        done.append(node.name or f"node {k}")
    return done


def conv_transpose_as_depth_to_space(model) -> list[str]:
    """Rewrite every ConvTranspose whose kernel equals its strides (k x k, stride k: the 2x
    upsampling of FPN/DB heads), unpadded, ungrouped and undilated, as a 1x1 Conv to O*k*k
    channels followed by DepthToSpace (DCR, blocksize k): each output pixel takes exactly one
    input pixel, so out[o, i*k+a, j*k+b] = sum_c x[c, i, j] W[c, o, a, b] + b[o] is a matrix
    product and a shuffle. IREE 3.13 lowers the ConvTranspose as a strided convolution over
    an input dilated with zeros (ppocr_det: 22 % of its time, against 2.4 % in onnxruntime,
    `doit profile`). Returns the names of those rewritten."""
    import numpy as np
    from onnx import helper, numpy_helper

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


REWRITES = {"depthwise_conv_as_dense": depthwise_conv_as_dense,
            "conv_transpose_as_depth_to_space": conv_transpose_as_depth_to_space}


def apply(source: Path, names: list[str], dest: Path) -> list[dict]:
    """Write `source` rewritten by `names` (in order) to `dest`; returns what each touched."""
    import onnx
    model = onnx.load(str(source))
    done = [{"rewrite": name, "nodes": REWRITES[name](model)} for name in names]
    dest.write_bytes(model.SerializeToString(deterministic=True))
    return done
