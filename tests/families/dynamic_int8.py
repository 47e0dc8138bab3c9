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
@dataclass(frozen=True)
class Boundary:
    """A dynamically quantized MatMul whose activations sit on rounding boundaries: x spans
    0..255 (scale 1, zero point 0) and `halves` of its values are k + 0.5, which onnxruntime
    rounds half to even; a value one ulp off (another runtime's rounding upstream) rounds the
    other way and moves the output by a weight step (~0.6). What a dynamically quantized LSTM
    does at some of its thousands of re-quantizations per step (text2tashkeel's bilstm.int8);
    `quantized=False`: the same MatMul in float on the dequantized weights (no rounding)."""
    seed: int = 0
    k: int = 32
    n: int = 8
    halves: int = 8
    quantized: bool = True

    def model(self):
        import numpy as np
        from onnx import TensorProto as T, helper as h, numpy_helper as nh
        w, scale = Member(seed=self.seed, k=self.k, n=self.n).weights()
        if self.quantized:
            inits = [nh.from_array(w, "w"), nh.from_array(scale, "w_scale"),
                     nh.from_array(np.zeros(scale.shape, np.int8), "w_zero")]
            nodes = [h.make_node("Relu", ["x"], ["xr"]),
                     h.make_node("DynamicQuantizeLinear", ["xr"], ["xq", "x_scale", "x_zero"]),
                     h.make_node("MatMulInteger", ["xq", "w", "x_zero", "w_zero"], ["acc"]),
                     h.make_node("Cast", ["acc"], ["accf"], to=T.FLOAT),
                     h.make_node("Mul", ["x_scale", "w_scale"], ["s"]),
                     h.make_node("Mul", ["accf", "s"], ["y"])]
        else:
            inits = [nh.from_array(w.astype(np.float32) * scale, "wf")]
            nodes = [h.make_node("Relu", ["x"], ["xr"]), h.make_node("MatMul", ["xr", "wf"], ["y"])]
        graph = h.make_graph(nodes, "boundary", [h.make_tensor_value_info("x", T.FLOAT, [1, self.k])],
                             [h.make_tensor_value_info("y", T.FLOAT, [1, self.n])], inits)
        return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])

    def feeds(self) -> dict:
        import numpy as np
        rng = np.random.default_rng(self.seed + 1000)
        x = rng.integers(1, 255, (1, self.k)).astype(np.float32)
        x[0, 0], x[0, 1] = 0.0, 255.0                       # scale exactly 1, zero point 0
        x[0, 2:2 + self.halves] = rng.integers(1, 250, self.halves) + np.float32(0.5)
        return {"x": x}
