"""Generated streaming TFLite models with resource variables (issue 40 item 2), as TF's converter
writes a stateful Keras model (a wake-word detector keeping its last frames): subgraph 0 starts
with CALL_ONCE of an initialiser subgraph that assigns each variable its initial value; then
VAR_HANDLE -> READ_VARIABLE gives the state, the frame is appended, the kept frames go back
through ASSIGN_VARIABLE, and a FULLY_CONNECTED head reads the whole window. Written with the
object API of the schema LiteRT ships, seeded.

    member                 what varies
    float_zeros            float32, one variable `frames` [1, 3, 8], initialised to zeros
    float_two_vars         + a second variable `total` [1, 5] accumulating the logits, whose
                           assigned value is also a graph output (its state output is a copy),
                           initialised to 0.25 by a non-constant initialiser (FILL)
    int8                   full-integer int8 (quantized input, state, weights, output; int8
                           variable with its quantization), `frames` initialised to its zero point
    read_twice             one variable read twice (before and after an ASSIGN_VARIABLE: the
                           second read sees the new value)

`members()` lists them as (name, bytes).
"""
from __future__ import annotations

import numpy as np

from families.tflite import FLOAT32, INT32, INT8, Graph, _op

RESOURCE = 13
FRAME, KEEP, CLASSES = 8, 3, 5


class StatefulGraph(Graph):
    """Graph plus an initialiser subgraph (index 1) and the resource-variable ops."""

    def __init__(self, seed: int = 0):
        super().__init__(seed)
        S = self.S
        self.init = S.SubGraphT()
        self.init.tensors, self.init.operators, self.init.inputs, self.init.outputs = [], [], [], []
        self.init.name = b"init"
        self.model.subgraphs.append(self.init)
        # CALL_ONCE first, as TF writes it
        self.op(_op("CALL_ONCE"), [], [], self.options("CallOnceOptions", initSubgraphIndex=1),
                "CallOnceOptions")

    def in_init(self, fn):
        """Run `fn` with tensors and ops going to the initialiser subgraph."""
        main = self.sub
        self.sub = self.init
        try:
            return fn()
        finally:
            self.sub = main

    def handle(self, variable: str) -> int:
        h = self.tensor(f"{variable}_handle_{len(self.sub.tensors)}", [], RESOURCE)
        self.op(_op("VAR_HANDLE"), [], [h],
                self.options("VarHandleOptions", container=b"", sharedName=variable.encode()),
                "VarHandleOptions")
        return h

    def read(self, variable: str, shape, dtype=FLOAT32, quant=None, name=None) -> int:
        h = self.handle(variable)
        v = self.tensor(name or f"{variable}_read_{len(self.sub.tensors)}", shape, dtype, quant=quant)
        self.op(_op("READ_VARIABLE"), [h], [v])
        return v

    def assign(self, variable: str, value: int) -> None:
        h = self.handle(variable)
        self.op(_op("ASSIGN_VARIABLE"), [h, value], [])

    def initialise(self, variable: str, array: np.ndarray, dtype=None, quant=None) -> None:
        def body():
            c = self.const(f"{variable}_initial", array, dtype=dtype, quant=quant)
            self.assign(variable, c)
        self.in_init(body)

    def finish(self, inputs, outputs) -> bytes:
        self.init.inputs, self.init.outputs = [], []
        return super().finish(inputs, outputs)


def _window(g: StatefulGraph, x: int, prev: int, dtype=FLOAT32, quant=None) -> tuple[int, int]:
    """[prev frames, x] along time, and the last KEEP of them (the next state)."""
    window = g.tensor("window", [1, KEEP + 1, FRAME], dtype, quant=quant)
    g.op(_op("CONCATENATION"), [prev, x], [window], g.options("ConcatenationOptions", axis=1),
         "ConcatenationOptions")
    kept = g.tensor("kept", [1, KEEP, FRAME], dtype, quant=quant)
    g.op(_op("STRIDED_SLICE"), [window, g.const("begin", np.array([0, 1, 0], np.int32)),
                                g.const("end", np.array([1, KEEP + 1, FRAME], np.int32)),
                                g.const("strides", np.array([1, 1, 1], np.int32))], [kept],
         g.options("StridedSliceOptions"), "StridedSliceOptions")
    return window, kept


def _head(g: StatefulGraph, window: int, name: str = "logits") -> int:
    flat = g.tensor("flat", [1, (KEEP + 1) * FRAME])
    g.op(_op("RESHAPE"), [window, g.const("flat_shape", np.array([1, (KEEP + 1) * FRAME], np.int32))],
         [flat], g.options("ReshapeOptions", newShape=[1, (KEEP + 1) * FRAME]), "ReshapeOptions")
    w = g.const("fc_w", g.rng.standard_normal((CLASSES, (KEEP + 1) * FRAME)).astype(np.float32) * 0.3)
    b = g.const("fc_b", g.rng.standard_normal(CLASSES).astype(np.float32) * 0.1)
    y = g.tensor(name, [1, CLASSES])
    g.op(_op("FULLY_CONNECTED"), [flat, w, b], [y], g.options("FullyConnectedOptions"),
         "FullyConnectedOptions")
    return y


def float_stream(two_vars: bool = False, seed: int = 0) -> bytes:
    g = StatefulGraph(seed)
    g.initialise("frames", np.zeros((1, KEEP, FRAME), np.float32))
    if two_vars:  # a non-constant initialiser: FILL(shape, 0.25)
        def body():
            total = g.tensor("total_initial", [1, CLASSES])
            g.op(_op("FILL"), [g.const("total_dims", np.array([1, CLASSES], np.int32)),
                               g.const("total_value", np.array(0.25, np.float32))], [total])
            g.assign("total", total)
        g.in_init(body)
    x = g.tensor("frame", [1, 1, FRAME])
    prev = g.read("frames", [1, KEEP, FRAME])
    window, kept = _window(g, x, prev)
    g.assign("frames", kept)
    y = _head(g, window)
    outputs = [y]
    if two_vars:
        before = g.read("total", [1, CLASSES])
        total = g.tensor("running_total", [1, CLASSES])
        g.op(_op("ADD"), [before, y], [total], g.options("AddOptions"), "AddOptions")
        g.assign("total", total)
        outputs.append(total)  # a graph output that is also a variable's new value
    return g.finish([x], outputs)


def read_twice(seed: int = 0) -> bytes:
    """`frames` read, assigned, read again: the head sees the new state (LiteRT's order)."""
    g = StatefulGraph(seed)
    g.initialise("frames", np.full((1, KEEP, FRAME), 0.5, np.float32))
    x = g.tensor("frame", [1, 1, FRAME])
    prev = g.read("frames", [1, KEEP, FRAME])
    _, kept = _window(g, x, prev)
    g.assign("frames", kept)
    again = g.read("frames", [1, KEEP, FRAME])
    scaled = g.tensor("scaled", [1, KEEP, FRAME])
    g.op(_op("MUL"), [again, g.const("two", np.array(2.0, np.float32))], [scaled],
         g.options("MulOptions"), "MulOptions")
    return g.finish([x], [scaled])


def int8_stream(seed: int = 0) -> bytes:
    """Full-integer: int8 frame in, int8 state (one scale for input, state and window, as
    CONCATENATION requires), int8 FULLY_CONNECTED, int8 logits out."""
    g = StatefulGraph(seed)
    act = (np.float32(1 / 64), np.int64(-3))  # the frames' quantization (zero point -3)
    g.initialise("frames", np.full((1, KEEP, FRAME), -3, np.int8), INT8, quant=act)
    x = g.tensor("frame", [1, 1, FRAME], INT8, quant=act)
    prev = g.read("frames", [1, KEEP, FRAME], INT8, quant=act)
    window, kept = _window(g, x, prev, INT8, act)
    g.assign("frames", kept)
    flat = g.tensor("flat", [1, (KEEP + 1) * FRAME], INT8, quant=act)
    g.op(_op("RESHAPE"), [window, g.const("flat_shape", np.array([1, (KEEP + 1) * FRAME], np.int32))],
         [flat], g.options("ReshapeOptions", newShape=[1, (KEEP + 1) * FRAME]), "ReshapeOptions")
    w = g.rng.standard_normal((CLASSES, (KEEP + 1) * FRAME)).astype(np.float32) * 0.3
    s_w = np.float32(np.abs(w).max() / 127)
    wq = g.const("fc_w", np.clip(np.round(w / s_w), -127, 127).astype(np.int8), quant=(s_w, np.int64(0)))
    s_b = np.float32(act[0] * s_w)
    bq = g.const("fc_b", np.round(g.rng.standard_normal(CLASSES) * 0.1 / s_b).astype(np.int32),
                 quant=(s_b, np.int64(0)))
    y = g.tensor("logits", [1, CLASSES], INT8, quant=(np.float32(0.05), np.int64(2)))
    g.op(_op("FULLY_CONNECTED"), [flat, wq, bq], [y], g.options("FullyConnectedOptions"),
         "FullyConnectedOptions")
    return g.finish([x], [y])


def members() -> list[tuple[str, bytes]]:
    return [("float_zeros", float_stream()), ("float_two_vars", float_stream(two_vars=True)),
            ("int8", int8_stream()), ("read_twice", read_twice())]
