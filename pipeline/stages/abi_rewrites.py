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
    depthwise_conv_as_slices   a depthwise Conv as zero borders (Concat) + one strided Slice times
                               a per-channel weight per kernel tap + Sum (+ bias): right for the
                               3x3 ones on that target, not for a 5x5 stride [2,1] one
"""
from __future__ import annotations

from pathlib import Path


def _attr(node, name, default):
    import onnx
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def _shape(model, name) -> list[int] | None:
    for v in list(model.graph.value_info) + list(model.graph.input) + list(model.graph.output):
        if v.name == name:
            dims = [d.dim_value if d.HasField("dim_value") else None for d in v.type.tensor_type.shape.dim]
            return dims if dims and None not in dims else None
    return None


def depthwise_conv_as_slices(model) -> list[str]:
    """Rewrite every depthwise 2-D Conv with static shapes; returns the names of those rewritten."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    inits = {i.name: i for i in model.graph.initializer}
    new_nodes, new_inits, done = [], [], []
    for k, node in enumerate(model.graph.node):
        w = inits.get(node.input[1]) if node.op_type == "Conv" and len(node.input) > 1 else None
        x_shape = _shape(model, node.input[0]) if w is not None else None
        y_shape = _shape(model, node.output[0]) if w is not None else None
        weight = numpy_helper.to_array(w) if w is not None else None
        group = _attr(node, "group", 1)
        if (weight is None or x_shape is None or y_shape is None or len(x_shape) != 4
                or weight.ndim != 4 or weight.shape[1] != 1 or group != x_shape[1]
                or weight.shape[0] != group or _attr(node, "auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET")):
            new_nodes.append(node)
            continue
        c, kh, kw = weight.shape[0], weight.shape[2], weight.shape[3]
        sh, sw = _attr(node, "strides", [1, 1])
        dh, dw = _attr(node, "dilations", [1, 1])
        pt, pl, pb, pr = _attr(node, "pads", [0, 0, 0, 0])
        _, _, oh, ow = y_shape
        p = f"{node.name or 'conv'}_{k}_dw"
        const = lambda name, arr: new_inits.append(numpy_helper.from_array(np.asarray(arr), name)) or name
        # zero borders by Concat, not Pad: IREE 3.13 fuses a Pad into the producer's store and
        # gets it wrong on this target (bisected: Conv 1x1 -> Relu -> Pad)
        padded, (n, _, h, wd) = node.input[0], x_shape
        dtype = weight.dtype
        for axis, before, after, extent in ((2, pt, pb, None), (3, pl, pr, None)):
            if not (before or after):
                continue
            shape = [n, c, h + (pt + pb if axis == 3 else 0), wd]
            parts = []
            if before:
                parts.append(const(f"{p}_z{axis}b", np.zeros([*shape[:axis], before, *shape[axis + 1:]], dtype)))
            parts.append(padded)
            if after:
                parts.append(const(f"{p}_z{axis}a", np.zeros([*shape[:axis], after, *shape[axis + 1:]], dtype)))
            out = f"{p}_padded{axis}"
            new_nodes.append(helper.make_node("Concat", parts, [out], axis=axis, name=f"{p}_pad{axis}"))
            padded = out
        axes = const(f"{p}_axes", np.array([2, 3], dtype=np.int64))
        steps = const(f"{p}_steps", np.array([sh, sw], dtype=np.int64))
        terms = []
        for i in range(kh):
            for j in range(kw):
                top, left = i * dh, j * dw
                sl = f"{p}_s{i}_{j}"
                new_nodes.append(helper.make_node(
                    "Slice", [padded, const(f"{sl}_starts", np.array([top, left], dtype=np.int64)),
                              const(f"{sl}_ends", np.array([top + (oh - 1) * sh + 1,
                                                            left + (ow - 1) * sw + 1], dtype=np.int64)),
                              axes, steps], [sl], name=sl))
                tap = weight[:, 0, i, j].reshape(1, c, 1, 1).astype(weight.dtype)
                new_nodes.append(helper.make_node("Mul", [sl, const(f"{sl}_w", tap)], [f"{sl}_m"],
                                                  name=f"{sl}_mul"))
                terms.append(f"{sl}_m")
        has_bias = len(node.input) > 2 and node.input[2]
        total = f"{p}_sum" if has_bias else node.output[0]
        new_nodes.append(helper.make_node("Sum", terms, [total], name=f"{p}_sum"))
        if has_bias:
            bias = numpy_helper.to_array(inits[node.input[2]]).reshape(1, c, 1, 1)
            new_nodes.append(helper.make_node("Add", [total, const(f"{p}_bias", bias)],
                                              [node.output[0]], name=f"{p}_bias_add"))
        done.append(node.name or f"node {k}")
    if done:
        del model.graph.node[:]
        model.graph.node.extend(new_nodes)
        model.graph.initializer.extend(new_inits)
        used = {i for n in model.graph.node for i in n.input}
        keep = [i for i in model.graph.initializer if i.name in used]
        del model.graph.initializer[:]
        model.graph.initializer.extend(keep)
        onnx.checker.check_model(model)
    return done


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


REWRITES = {"depthwise_conv_as_slices": depthwise_conv_as_slices,
            "depthwise_conv_as_dense": depthwise_conv_as_dense}


def apply(source: Path, names: list[str], dest: Path) -> list[dict]:
    """Write `source` rewritten by `names` (in order) to `dest`; returns what each touched."""
    import onnx
    model = onnx.load(str(source))
    done = [{"rewrite": name, "nodes": REWRITES[name](model)} for name in names]
    dest.write_bytes(model.SerializeToString(deterministic=True))
    return done
