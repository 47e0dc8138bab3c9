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


REWRITES = {"depthwise_conv_as_dense": depthwise_conv_as_dense}


def apply(source: Path, names: list[str], dest: Path) -> list[dict]:
    """Write `source` rewritten by `names` (in order) to `dest`; returns what each touched."""
    import onnx
    model = onnx.load(str(source))
    done = [{"rewrite": name, "nodes": REWRITES[name](model)} for name in names]
    dest.write_bytes(model.SerializeToString(deterministic=True))
    return done
