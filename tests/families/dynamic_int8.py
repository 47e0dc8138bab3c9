"""Generated dynamically quantized MatMuls in standard ONNX, as onnxruntime's quantize_dynamic
writes them (issue 40: golden that depends on the CPU): DynamicQuantizeLinear of the float
activation -> MatMulInteger with int8 weights -> Cast -> Mul by the two scales -> Add bias; or the
raw int32 MatMulInteger output (`raw`). Weights near +-127 and activations spanning 0..255 make
pairs of uint8 x int8 products exceed int16, where an AVX2 kernel (vpmaddubsw) saturates.

References in numpy: `exact` (int64: what VNNI, IREE and TVM compute) and `avx2_pairs` (the
pairwise int16-saturating sum of a u8 x s8 pmaddubsw kernel, then int32: an emulation of what
onnxruntime's AVX2 kernel computes, for the raw product).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Member:
    seed: int = 0
    m: int = 4
    k: int = 64
    n: int = 8
    per_column: bool = False  # b_zero_point per output column (int8 zeros) or one for all
    raw: bool = False         # the output is MatMulInteger's int32 itself
    large: bool = True        # weights at +-127: pairs of products beyond int16

    @property
    def name(self) -> str:
        return (f"{'raw' if self.raw else 'dequantized'}-M{self.m}-K{self.k}-N{self.n}"
                f"{'-col' if self.per_column else ''}{'-large' if self.large else ''}")

    def weights(self):
        import numpy as np
        rng = np.random.default_rng(self.seed)
        if self.large:
            w = rng.choice(np.array([-127, -126, 120, 127], np.int8), (self.k, self.n))
        else:
            w = rng.integers(-40, 41, (self.k, self.n)).astype(np.int8)
        return w, (rng.uniform(0.001, 0.01, self.n) if self.per_column else
                   rng.uniform(0.001, 0.01, ())).astype(np.float32)

    def model(self):
        import numpy as np
        from onnx import TensorProto as T, helper as h, numpy_helper as nh
        w, scale = self.weights()
        zero = np.zeros(scale.shape, np.int8)
        inits = [nh.from_array(w, "w"), nh.from_array(scale, "w_scale"), nh.from_array(zero, "w_zero"),
                 nh.from_array(np.random.default_rng(self.seed + 1).standard_normal(self.n)
                               .astype(np.float32), "bias")]
        nodes = [h.make_node("DynamicQuantizeLinear", ["x"], ["xq", "x_scale", "x_zero"]),
                 h.make_node("MatMulInteger", ["xq", "w", "x_zero", "w_zero"], ["acc"], name="mmi")]
        if self.raw:
            out = h.make_tensor_value_info("acc", T.INT32, [self.m, self.n])
        else:
            nodes += [h.make_node("Cast", ["acc"], ["accf"], to=T.FLOAT),
                      h.make_node("Mul", ["x_scale", "w_scale"], ["s"]),
                      h.make_node("Mul", ["accf", "s"], ["y0"]),
                      h.make_node("Add", ["y0", "bias"], ["y"])]
            out = h.make_tensor_value_info("y", T.FLOAT, [self.m, self.n])
        graph = h.make_graph(nodes, "dynamic_int8", [h.make_tensor_value_info("x", T.FLOAT, [self.m, self.k])],
                             [out], inits)
        return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])

    def feeds(self) -> dict:
        import numpy as np
        rng = np.random.default_rng(self.seed + 1000)
        return {"x": (rng.uniform(-1, 3, (self.m, self.k))).astype(np.float32)}


def members() -> list[Member]:
    return [Member(seed=0, raw=True), Member(seed=1, raw=True, k=600, per_column=True),
            Member(seed=2), Member(seed=3, m=2, k=300, n=5, per_column=True),
            Member(seed=4, large=False)]


def quantize(x):
    """onnxruntime's DynamicQuantizeLinear in numpy: (uint8 q, zero point)."""
    import numpy as np
    low, high = min(x.min(), np.float32(0)), max(x.max(), np.float32(0))
    scale = np.float32((high - low) / np.float32(255))
    zp = np.round(np.clip(np.float32(0) - low / scale, 0, 255))
    return np.clip(np.round(x / scale) + zp, 0, 255).astype(np.uint8), int(zp)


def exact(q, zp: int, w):
    """(q - zp) @ w in int64."""
    import numpy as np
    return (q.astype(np.int64) - zp) @ w.astype(np.int64)


def avx2_pairs(q, zp: int, w):
    """u8 q x s8 w as a pmaddubsw kernel sums them: each pair of adjacent products along K
    saturated to int16, the pairs summed in int32; the zero point applied after, as
    onnxruntime's kernels do (zp times the column sums of w)."""
    import numpy as np
    k = q.shape[1] + q.shape[1] % 2
    qq = np.zeros((q.shape[0], k), np.int64)
    ww = np.zeros((k, w.shape[1]), np.int64)
    qq[:, :q.shape[1]], ww[:w.shape[0]] = q, w
    prods = qq[:, :, None] * ww[None, :, :]                    # [M, K, N]
    pairs = np.clip(prods[:, 0::2] + prods[:, 1::2], -32768, 32767)
    return pairs.sum(axis=1) - zp * w.astype(np.int64).sum(axis=0)


# ----------------------------------------------------------------------------- flips (reference noise)
def flipping_lstm():
    """A DynamicQuantizeLSTM (24 steps, hidden 64) whose 8-bit re-quantization of the hidden
    state is one ulp from a rounding boundary somewhere: its outputs move by ~1e-2 when the
    reference's tanh/sigmoid or the quantizer's input move by one ulp (golden's `noise`), as
    text2tashkeel's bilstm.int8 does (4.5e-3). (model, feeds) of tests/families/contrib.py."""
    from . import contrib as fc
    return fc.Lstm(seed=4, seq=24, hidden=64, size=16).build()


def float_twin(model):
    """The same model with its DynamicQuantizeLSTM a float LSTM on the dequantized weights: the
    same function without the 8-bit rounding of activations (no flips)."""
    import onnx
    from onnx import helper as h, numpy_helper as nh
    from pipeline.rewrite.contrib_ops import _dequant_rnn
    model = onnx.ModelProto.FromString(model.SerializeToString())
    inits = {t.name: nh.to_array(t) for t in model.graph.initializer}
    for k, node in enumerate(model.graph.node):
        if node.op_type != "DynamicQuantizeLSTM":
            continue
        ins = list(node.input) + [""] * (12 - len(node.input))
        w, r = f"{node.name}_Wf", f"{node.name}_Rf"
        model.graph.initializer.extend([nh.from_array(_dequant_rnn(inits, ins[1], ins[8], ins[9]), w),
                                        nh.from_array(_dequant_rnn(inits, ins[2], ins[10], ins[11]), r)])
        attrs = {a.name: h.get_attribute_value(a) for a in node.attribute}
        lstm_in = [ins[0], w, r] + ins[3:8]
        while not lstm_in[-1]:
            lstm_in.pop()
        model.graph.node[k].CopyFrom(h.make_node("LSTM", lstm_in, list(node.output),
                                                 name=node.name, **attrs))
    del model.opset_import[:]
    model.opset_import.extend([h.make_opsetid("", 17)])
    return model
