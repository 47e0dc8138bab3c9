"""Generated 1-D convolution graphs: the op class of byte-level classifiers, audio and speech
models (issue 39 item 3), in the forms exporters write it.

  ncw     x [N, C, L] -> Conv (1-D, [O, C / group, k]) -> Relu: PyTorch's Conv1d;
  nwc-tf  x [N, L, C] -> Unsqueeze (axis 1) -> Transpose to [N, C, 1, L] -> Conv (2-D, kernel
          [1, k]) -> Transpose to [N, 1, L', O] -> Squeeze -> Relu: TensorFlow's conv1d through
          tf2onnx (conv1d is ExpandDims + Conv2D in TensorFlow);
  nchw-h  x [N, C, L, 1] -> Conv (2-D, kernel [k, 1]) -> Relu: a line along H.
Each case sets the channels, kernel, stride, dilation, group, padding (explicit pads, auto_pad
SAME_UPPER / VALID) and bias. `other_convs()` are Convs the rewrite must leave alone: 2-D Convs
over a real image, a kernel across the unit axis, weights computed in the graph, a depthwise
kernel of 40 taps (a Slice and a Mul per tap: at most 32).
"""
from __future__ import annotations

from dataclasses import dataclass

OPSET = 13


def _np():
    import numpy as np
    return np


@dataclass(frozen=True)
class Conv1dCase:
    cin: int = 8
    cout: int = 12
    kernel: int = 3
    stride: int = 1
    dilation: int = 1
    group: int = 1
    pad: str = "same"        # same: explicit pads keeping L (stride 1); SAME_UPPER; VALID; none
    bias: bool = True
    layout: str = "ncw"      # ncw | nwc-tf | nchw-h
    length: int = 29
    batch: int = 1

    @property
    def id(self) -> str:
        return (f"{self.layout}-c{self.cin}o{self.cout}k{self.kernel}s{self.stride}d{self.dilation}"
                f"g{self.group}-{self.pad}{'-b' if self.bias else ''}{f'-n{self.batch}' if self.batch > 1 else ''}")

    def input_shape(self) -> list[int]:
        n, c, l = self.batch, self.cin, self.length
        return {"ncw": [n, c, l], "nwc-tf": [n, l, c], "nchw-h": [n, c, l, 1]}[self.layout]

    def input(self, seed: int = 3):
        np = _np()
        return np.random.default_rng(seed).standard_normal(self.input_shape()).astype(np.float32)

    def model(self, seed: int = 0):
        """The case's graph, opset 13, checked."""
        import onnx
        from onnx import TensorProto, helper, numpy_helper
        np = _np()
        rng = np.random.default_rng(seed)
        k = self.kernel
        weight = rng.standard_normal((self.cout, self.cin // self.group, k)).astype(np.float32)
        inits = {"W": weight}
        attrs = {"group": self.group}
        spatial = {"ncw": None, "nwc-tf": 1, "nchw-h": 0}[self.layout]  # the 2-D kernel's line axis
        if spatial is None:
            attrs.update(kernel_shape=[k], strides=[self.stride], dilations=[self.dilation])
        else:
            inits["W"] = weight.reshape(self.cout, self.cin // self.group, *([1, k] if spatial else [k, 1]))
            attrs.update(kernel_shape=[1, k] if spatial else [k, 1],
                         strides=[1, self.stride] if spatial else [self.stride, 1],
                         dilations=[1, self.dilation] if spatial else [self.dilation, 1])
        total = (k - 1) * self.dilation
        if self.pad == "same":
            before, after = total // 2, total - total // 2
            attrs["pads"] = ([before, after] if spatial is None else
                             [0, before, 0, after] if spatial else [before, 0, after, 0])
        elif self.pad in ("SAME_UPPER", "VALID"):
            attrs["auto_pad"] = self.pad
        if self.bias:
            inits["B"] = rng.standard_normal(self.cout).astype(np.float32)
        conv_in = ["c_in", "W"] + (["B"] if self.bias else [])
        nodes = []
        if self.layout == "nwc-tf":
            inits["axis1"] = np.array([1], np.int64)
            nodes += [helper.make_node("Unsqueeze", ["x", "axis1"], ["x4"]),
                      helper.make_node("Transpose", ["x4"], ["c_in"], perm=[0, 3, 1, 2]),
                      helper.make_node("Conv", conv_in, ["c"], name="conv", **attrs),
                      helper.make_node("Transpose", ["c"], ["c_t"], perm=[0, 2, 3, 1]),
                      helper.make_node("Squeeze", ["c_t", "axis1"], ["c_out"])]
        else:
            nodes += [helper.make_node("Identity", ["x"], ["c_in"]),
                      helper.make_node("Conv", conv_in, ["c_out"], name="conv", **attrs)]
        nodes.append(helper.make_node("Relu", ["c_out"], ["y"]))
        graph = helper.make_graph(
            nodes, "conv1d", [helper.make_tensor_value_info("x", TensorProto.FLOAT, self.input_shape())],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
            [numpy_helper.from_array(a, name) for name, a in inits.items()])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
        model.ir_version = 8
        model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
        onnx.checker.check_model(model)
        return model


# the family: kernels 1-15 and 64, strides 1-16, dilations 1-2, groups (grouped, depthwise), channels,
# every padding form, the three layouts, a batch of 2
CASES = (
    Conv1dCase(),
    Conv1dCase(kernel=5, bias=False),
    Conv1dCase(kernel=1, pad="none"),
    Conv1dCase(kernel=3, stride=2, pad="SAME_UPPER"),
    Conv1dCase(kernel=7, stride=3, pad="VALID"),
    Conv1dCase(kernel=3, dilation=2),
    Conv1dCase(cin=8, cout=12, kernel=3, group=4),
    Conv1dCase(cin=8, cout=8, kernel=5, group=8),              # depthwise
    Conv1dCase(cin=6, cout=6, kernel=15, group=6, pad="VALID"),  # depthwise, > 7 taps: chunked
    Conv1dCase(cin=6, cout=12, kernel=3, group=6),             # depthwise, channel multiplier 2
    Conv1dCase(cin=3, cout=16, kernel=4, stride=2, pad="VALID", batch=2),
    Conv1dCase(cin=1, cout=9, kernel=64, stride=16, pad="VALID", length=400),  # an STFT's shape
    Conv1dCase(layout="nwc-tf"),
    Conv1dCase(layout="nwc-tf", kernel=5, stride=2, pad="SAME_UPPER", bias=False),
    Conv1dCase(layout="nwc-tf", cin=8, cout=8, kernel=3, group=8),
    Conv1dCase(layout="nchw-h", kernel=3, dilation=2),
)
# a few of CASES, one per form, that the e2e tests also compile with IREE
IREE_CASES = (CASES[0], CASES[3], CASES[6], CASES[7], CASES[10], CASES[11], CASES[13])


def other_convs():
    """Convs the rewrite must leave alone, as (name, model, input)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    np = _np()
    rng = np.random.default_rng(5)

    def one(name, x_shape, w_shape, computed_weight=False, **attrs):
        w = rng.standard_normal(w_shape).astype(np.float32)
        nodes = [helper.make_node("Conv", ["x", "Wc" if computed_weight else "W"], ["y"], name="conv", **attrs)]
        if computed_weight:
            nodes.insert(0, helper.make_node("Relu", ["W"], ["Wc"]))
        graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                                  [numpy_helper.from_array(w, "W")])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
        model.ir_version = 8
        model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
        onnx.checker.check_model(model)
        return name, model, rng.standard_normal(x_shape).astype(np.float32)

    return [one("image-3x3", [1, 4, 6, 7], [5, 4, 3, 3], pads=[1, 1, 1, 1]),
            one("image-1x3", [1, 4, 6, 7], [5, 4, 1, 3], pads=[0, 1, 0, 1]),
            one("across-unit-axis", [1, 4, 1, 9], [5, 4, 3, 1], pads=[1, 0, 1, 0]),
            one("computed-weight", [1, 4, 9], [5, 4, 3], computed_weight=True, pads=[1, 1]),
            one("depthwise-40-taps", [1, 4, 60], [4, 1, 40], group=4)]


def combined(cases, seed: int = 0):
    """One graph holding each case's graph side by side (inputs x0, x1, ..., outputs y0, y1, ...;
    node names prefixed "c0/", ...): one compile checks them all."""
    import onnx
    from onnx import compose, helper
    graphs = [compose.add_prefix(case.model(seed), f"c{i}/").graph for i, case in enumerate(cases)]
    renamed = []
    for i, g in enumerate(graphs):
        for node in g.node:
            node.input[:] = [f"x{i}" if v == f"c{i}/x" else v for v in node.input]
            node.output[:] = [f"y{i}" if v == f"c{i}/y" else v for v in node.output]
        g.input[0].name, g.output[0].name = f"x{i}", f"y{i}"
        renamed.append(g)
    graph = helper.make_graph([n for g in renamed for n in g.node], "conv1d_family",
                              [g.input[0] for g in renamed], [g.output[0] for g in renamed],
                              [t for g in renamed for t in g.initializer])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    onnx.checker.check_model(model)
    return model
