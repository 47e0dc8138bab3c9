"""Generated TFLite models with control flow and dynamic inputs (issue 40, the TFLite classes the
public corpus left): written with the object API of the schema LiteRT ships, seeded.

    member          what varies
    if_data         IF on a condition computed from the input (MEAN -> GREATER_EQUAL -> RESHAPE
                    [1], as onnx-tf writes openWakeWord's hey_jarvis): the then branch computes
                    (FULLY_CONNECTED + LOGISTIC), the else branch passes an operand through
    if_nested       the then branch holds an IF of its own (a second condition on the input),
                    both inner branches computing; every branch reads a weight the outer graph
                    owns (an IF operand) and one of its own (a branch constant)
    if_int8         int8 operands and output (quantized input, branch weights and output: the IF
                    output stays integer; the branches requantize to its scale)
    while_count     WHILE: a counter i < 3 in the cond subgraph, the body scales and shifts the
                    input (ADD with a fused RELU) and counts; the loop runs 3 times
    dynamic_conv    an input whose dims are all dynamic ([-1, -1], like openWakeWord's
                    melspectrogram): RESHAPE to [1, 1, -1, 1] -> CONV_2D 1x5 VALID; LiteRT cannot
                    prepare it at 1x1 (the conv's output would have width -3), only at a length
                    the spec gives
    dynamic_conv_add_relu  the same + an ADD with a fused RELU, which tflite_rewrite unfuses and
                    checks in LiteRT (at the spec's shape too)

`members()` lists them as (name, bytes).
"""
from __future__ import annotations

import numpy as np

from families.tflite import FLOAT32, INT8, INT32, VALID, Graph, _op

BOOL = 6
N = 8


class BranchGraph(Graph):
    """Graph plus branch subgraphs: `branch(fn, operands)` builds a subgraph whose inputs mirror
    the operands (same shapes, dtypes, quantization) and whose outputs are what `fn` returns."""

    def branch(self, fn, operands: list[int], name: str) -> int:
        S = self.S
        outer = self.sub
        sub = S.SubGraphT()
        sub.tensors, sub.operators, sub.name = [], [], name.encode()
        self.model.subgraphs.append(sub)
        index = len(self.model.subgraphs) - 1
        self.sub = sub
        try:
            args = []
            for k, j in enumerate(operands):
                t = outer.tensors[j]
                q = t.quantization
                quant = (q.scale[0], q.zeroPoint[0]) if q is not None and q.scale is not None else None
                args.append(self.tensor(f"{name}_arg{k}", list(t.shape), t.type, quant=quant))
            outs = fn(*args)
            sub.inputs, sub.outputs = args, list(outs)
        finally:
            self.sub = outer
        return index

    def if_op(self, cond: int, operands: list[int], then, other, out: int, name: str = "if") -> None:
        t = self.branch(then, operands, f"{name}_then")
        e = self.branch(other, operands, f"{name}_else")
        self.op(_op("IF"), [cond] + operands, [out],
                self.options("IfOptions", thenSubgraphIndex=t, elseSubgraphIndex=e), "IfOptions")

    def condition(self, x: int, threshold: float, name: str) -> int:
        """MEAN(x) >= threshold, as a bool [1] (the IF condition onnx-tf writes)."""
        m = self.tensor(f"{name}_mean", [1, 1])
        self.op(_op("MEAN"), [x, self.const(f"{name}_axes", np.array([1], np.int32))], [m],
                self.options("ReducerOptions", keepDims=True), "ReducerOptions")
        ge = self.tensor(f"{name}_ge", [1, 1], BOOL)
        self.op(_op("GREATER_EQUAL"), [m, self.const(f"{name}_t", np.array([threshold], np.float32))], [ge])
        c = self.tensor(f"{name}_cond", [1], BOOL)
        self.op(_op("RESHAPE"), [ge, self.const(f"{name}_shape", np.array([1], np.int32))], [c])
        return c

    def dense(self, x: int, w: int, name: str, act: int = 0, out_quant=None, dtype=FLOAT32) -> int:
        y = self.tensor(name, [1, N], dtype, quant=out_quant)
        self.op(_op("FULLY_CONNECTED"), [x, w, -1], [y],
                self.options("FullyConnectedOptions", fusedActivationFunction=act), "FullyConnectedOptions")
        return y


def if_data(seed: int = 0) -> bytes:
    g = BranchGraph(seed)
    x = g.tensor("x", [1, N])
    w = g.const("w_outer", g.rng.normal(0, 0.5, (N, N)).astype(np.float32))
    out = g.tensor("y", [1, N])

    def then(a, b):
        h = g.dense(a, b, "then_fc", act=1)
        y = g.tensor("then_y", [1, N])
        g.op(_op("LOGISTIC"), [h], [y])
        return [y]
    g.if_op(g.condition(x, 0.5, "c"), [x, w], then, lambda a, b: [a], out)
    return g.finish([x], [out])


def if_nested(seed: int = 1) -> bytes:
    g = BranchGraph(seed)
    x = g.tensor("x", [1, N])
    w = g.const("w_outer", g.rng.normal(0, 0.5, (N, N)).astype(np.float32))
    out = g.tensor("y", [1, N])

    def inner_then(a, b):
        own = g.const("inner_w", g.rng.normal(0, 0.5, (N, N)).astype(np.float32))
        return [g.dense(g.dense(a, b, "it_fc1", act=1), own, "it_fc2")]

    def inner_else(a, b):
        y = g.tensor("ie_y", [1, N])
        g.op(_op("MUL"), [a, g.const("ie_k", np.full((1, N), -2.0, np.float32))], [y],
             g.options("MulOptions"), "MulOptions")
        return [y]

    def then(a, b):
        y = g.tensor("then_y", [1, N])
        g.if_op(g.condition(a, 0.6, "c_inner"), [a, b], inner_then, inner_else, y, "inner")
        return [y]

    def other(a, b):
        y = g.tensor("else_y", [1, N])
        g.op(_op("TANH"), [g.dense(a, b, "else_fc")], [y])
        return [y]
    g.if_op(g.condition(x, 0.4, "c"), [x, w], then, other, out)
    return g.finish([x], [out])


def if_int8(seed: int = 2) -> bytes:
    g = BranchGraph(seed)
    qx, qy = (0.02, -10), (0.05, 3)
    x = g.tensor("x", [1, N], INT8, quant=qx)
    w = g.const("w_outer", g.rng.integers(-60, 60, (N, N)).astype(np.int8), quant=(0.01, 0))
    b = g.const("b_outer", g.rng.integers(-200, 200, (N,)).astype(np.int32), INT32, quant=(0.02 * 0.01, 0))
    out = g.tensor("y", [1, N], INT8, quant=qy)
    xf = g.tensor("x_float", [1, N])
    g.op(_op("DEQUANTIZE"), [x], [xf])

    def then(a, wq, bq):
        y = g.tensor("then_y", [1, N], INT8, quant=qy)
        g.op(_op("FULLY_CONNECTED"), [a, wq, bq], [y],
             g.options("FullyConnectedOptions", fusedActivationFunction=1), "FullyConnectedOptions")
        return [y]

    def other(a, wq, bq):
        y = g.tensor("else_y", [1, N], INT8, quant=qy)
        g.op(_op("QUANTIZE"), [a], [y])  # requantize to the output's scale
        return [y]
    g.if_op(g.condition(xf, 0.0, "c"), [x, w, b], then, other, out)
    return g.finish([x], [out])


def while_count(seed: int = 4) -> bytes:
    g = BranchGraph(seed)
    x = g.tensor("x", [1, N])
    i0 = g.const("i0", np.array([0], np.int32))
    i_out, out = g.tensor("i_final", [1], INT32), g.tensor("y", [1, N])

    def cond(i, v):
        c = g.tensor("while_less", [1], BOOL)
        g.op(_op("LESS"), [i, g.const("count", np.array([3], np.int32))], [c])
        r = g.tensor("while_c", [], BOOL)
        g.op(_op("RESHAPE"), [c, g.const("cond_shape", np.zeros(0, np.int32))], [r])
        return [r]

    def body(i, v):
        j, h, y = g.tensor("i_next", [1], INT32), g.tensor("v_scaled", [1, N]), g.tensor("v_next", [1, N])
        g.op(_op("ADD"), [i, g.const("one", np.array([1], np.int32))], [j],
             g.options("AddOptions"), "AddOptions")
        g.op(_op("MUL"), [v, g.const("k", np.full((1, N), 1.5, np.float32))], [h],
             g.options("MulOptions"), "MulOptions")
        g.op(_op("ADD"), [h, g.const("c", g.rng.normal(0, 0.1, (1, N)).astype(np.float32))], [y],
             g.options("AddOptions", fusedActivationFunction=1), "AddOptions")
        return [j, y]
    c = g.branch(cond, [i0, x], "cond")
    b = g.branch(body, [i0, x], "body")
    g.op(_op("WHILE"), [i0, x], [i_out, out],
         g.options("WhileOptions", condSubgraphIndex=c, bodySubgraphIndex=b), "WhileOptions")
    return g.finish([x], [out])


def dynamic_conv(seed: int = 3, add_relu: bool = False) -> bytes:
    g = Graph(seed)
    x = g.tensor("samples", [1, 1], signature=[-1, -1])
    r = g.tensor("frames", [1, 1, 1, 1], signature=[1, 1, -1, 1])
    g.op(_op("RESHAPE"), [x, g.const("shape", np.array([1, 1, -1, 1], np.int32))], [r],
         g.options("ReshapeOptions", newShape=[1, 1, -1, 1]), "ReshapeOptions")
    w = g.const("kernel", g.rng.normal(0, 0.5, (4, 1, 5, 1)).astype(np.float32))
    b = g.const("bias", g.rng.normal(0, 0.1, (4,)).astype(np.float32))
    y = g.tensor("features", [1, 1, 1, 4], signature=[1, 1, -1, 4])
    g.op(_op("CONV_2D"), [r, w, b], [y],
         g.options("Conv2DOptions", padding=VALID, strideH=1, strideW=1, dilationHFactor=1,
                   dilationWFactor=1, fusedActivationFunction=1), "Conv2DOptions")
    if add_relu:  # an ADD with a fused RELU: tflite_rewrite unfuses it, checked in LiteRT
        z = g.tensor("shifted", [1, 1, 1, 4], signature=[1, 1, -1, 4])
        g.op(_op("ADD"), [y, g.const("shift", g.rng.normal(0, 0.5, (4,)).astype(np.float32))], [z],
             g.options("AddOptions", fusedActivationFunction=1), "AddOptions")
        y = z
    return g.finish([x], [y])


def members() -> list[tuple[str, bytes]]:
    return [("if_data", if_data()), ("if_nested", if_nested()), ("if_int8", if_int8()),
            ("while_count", while_count()), ("dynamic_conv", dynamic_conv()),
            ("dynamic_conv_add_relu", dynamic_conv(add_relu=True))]
