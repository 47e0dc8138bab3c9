"""Generated detector graphs: a small conv backbone -> boxes + scores -> data-dependent
post-processing, the forms exported detectors end in (docs/postprocess.md).

The backbone: x [1, 3, 16, 16] -> Conv (stride 2) -> Relu -> two 1x1 Convs: box deltas added to
a constant grid of anchors (corner boxes [1, 64, 4], neighbours overlapping), and per-class
scores (Sigmoid, [1, C, 64]). Then one of:
  nms       NonMaxSuppression -> Gather of the boxes (divided by the input's width: the
            post-processing reads a graph input's Shape), GatherND of the scores, the classes;
  topk      a TopK whose K counts the scores above a threshold (K from data) -> Gather of boxes;
  nonzero   NonZero of scores > threshold -> Gather of boxes and scores.
`ties`: scores quantized to quarters (Round(4 s) / 4), so many are equal and NMS's choice among
tied, overlapping boxes is decided by their order only.
"""
from __future__ import annotations

from dataclasses import dataclass

from families.control_flow import _const, _model, _np

HEADS = ("nms", "topk", "nonzero")
SHAPE = (1, 3, 16, 16)
CELLS = 8          # 8 x 8 grid after the stride-2 conv: 64 anchors
OPSET = 17


def _anchors():
    """[1, 64, 4] corner boxes (y1, x1, y2, x2), two cells wide: a box overlaps its neighbours
    (IoU 1/3), so NMS suppresses some."""
    np = _np()
    ys, xs = np.meshgrid(np.arange(CELLS), np.arange(CELLS), indexing="ij")
    boxes = np.stack([ys, xs, ys + 2, xs + 2], -1).reshape(1, CELLS * CELLS, 4)
    return boxes.astype(np.float32)


@dataclass(frozen=True)
class DetectorCase:
    head: str            # nms | topk | nonzero
    ties: bool = False
    classes: int = 2

    @property
    def name(self) -> str:
        return f"{self.head}{'-ties' if self.ties else ''}-c{self.classes}"

    def inputs(self) -> list[dict]:
        return [{"name": "x", "shape": list(SHAPE), "dtype": "float32"}]

    def feeds(self) -> dict:
        np = _np()
        return {"x": np.random.default_rng(0).uniform(-1, 1, SHAPE).astype(np.float32)}

    def model(self):
        from onnx import TensorProto as T
        from onnx import helper as h
        from onnx import numpy_helper
        np = _np()
        rng = np.random.default_rng(1)
        c = self.classes
        inits = [numpy_helper.from_array(a.astype(np.float32), n) for n, a in (
            ("w1", rng.normal(0, 0.5, (8, 3, 3, 3))), ("b1", rng.normal(0, 0.1, 8)),
            ("wb", rng.normal(0, 0.2, (4, 8, 1, 1))), ("wc", rng.normal(0, 1.0, (c, 8, 1, 1))),
            ("bc", rng.normal(0, 0.5, c)), ("anchors", _anchors()))]
        nodes = [
            h.make_node("Conv", ["x", "w1", "b1"], ["f0"], strides=[2, 2], pads=[1, 1, 1, 1]),
            h.make_node("Relu", ["f0"], ["f"]),
            h.make_node("Conv", ["f", "wb"], ["d"]),                   # [1, 4, 8, 8]
            _const("shape_b", [1, 4, CELLS * CELLS], np.int64),
            h.make_node("Reshape", ["d", "shape_b"], ["d2"]),
            h.make_node("Transpose", ["d2"], ["d3"], perm=[0, 2, 1]),  # [1, 64, 4]
            h.make_node("Add", ["anchors", "d3"], ["boxes"]),
            h.make_node("Conv", ["f", "wc", "bc"], ["s"]),             # [1, C, 8, 8]
            _const("shape_s", [1, c, CELLS * CELLS], np.int64),
            h.make_node("Reshape", ["s", "shape_s"], ["s2"]),
            h.make_node("Sigmoid", ["s2"], ["s3"]),
        ]
        if self.ties:
            nodes += [_const("four", np.float32(4)),
                      h.make_node("Mul", ["s3", "four"], ["s4"]),
                      h.make_node("Round", ["s4"], ["s5"]),
                      h.make_node("Div", ["s5", "four"], ["scores"])]
        else:
            nodes.append(h.make_node("Identity", ["s3"], ["scores"]))
        nodes += getattr(self, f"_{self.head}")(np)
        outputs = {"nms": [("det_boxes", T.FLOAT, ["n", 4]), ("det_scores", T.FLOAT, ["n"]),
                           ("det_classes", T.INT64, ["n"])],
                   "topk": [("top_boxes", T.FLOAT, ["k", 4]), ("top_scores", T.FLOAT, ["k"])],
                   "nonzero": [("hit_boxes", T.FLOAT, ["m", 4]), ("hit_scores", T.FLOAT, ["m"]),
                               ("hit_classes", T.INT64, ["m"])]}[self.head]
        return _model(nodes, [h.make_tensor_value_info("x", T.FLOAT, ["N", 3, 16, 16])],
                      [h.make_tensor_value_info(n, t, d) for n, t, d in outputs], inits, OPSET)

    # the heads: each reads `boxes` [1, 64, 4] and `scores` [1, C, 64]
    def _nms(self, np):
        from onnx import helper as h
        return [
            _const("max_out", [6], np.int64), _const("iou_th", [0.3], np.float32),
            _const("score_th", [0.25], np.float32),
            h.make_node("NonMaxSuppression", ["boxes", "scores", "max_out", "iou_th", "score_th"],
                        ["selected"]),                                  # [n, 3]
            _const("zero", [0], np.int64), _const("one", [1], np.int64),
            _const("two", [2], np.int64), _const("three", [3], np.int64),
            h.make_node("Slice", ["selected", "two", "three", "one"], ["box_idx2"]),
            h.make_node("Squeeze", ["box_idx2", "one"], ["box_idx"]),
            h.make_node("Squeeze", ["boxes", "zero"], ["boxes0"]),
            h.make_node("Gather", ["boxes0", "box_idx"], ["gathered"]),
            h.make_node("Shape", ["x"], ["xshape"]),                    # the post-processing
            _const("w_at", [3], np.int64),                              # reads a graph input
            h.make_node("Gather", ["xshape", "w_at"], ["width"]),
            h.make_node("Cast", ["width"], ["widthf"], to=1),
            h.make_node("Div", ["gathered", "widthf"], ["det_boxes"]),
            h.make_node("GatherND", ["scores", "selected"], ["det_scores"]),
            h.make_node("Slice", ["selected", "one", "two", "one"], ["cls2"]),
            h.make_node("Squeeze", ["cls2", "one"], ["det_classes"]),
        ]

    def _topk(self, np):
        from onnx import helper as h
        return [
            _const("th", np.float32(0.5), np.float32),
            h.make_node("ReduceMax", ["scores"], ["best"], axes=[1], keepdims=0),  # [1, 64]
            h.make_node("Greater", ["best", "th"], ["above"]),
            h.make_node("Cast", ["above"], ["above_i"], to=7),
            h.make_node("ReduceSum", ["above_i"], ["count"], keepdims=0),
            _const("k_shape", [1], np.int64),
            h.make_node("Reshape", ["count", "k_shape"], ["k"]),
            h.make_node("TopK", ["best", "k"], ["top_scores2", "top_idx"], axis=1),
            _const("zero", [0], np.int64),
            h.make_node("Squeeze", ["top_scores2", "zero"], ["top_scores"]),
            h.make_node("Squeeze", ["top_idx", "zero"], ["idx"]),
            h.make_node("Squeeze", ["boxes", "zero"], ["boxes0"]),
            h.make_node("Gather", ["boxes0", "idx"], ["top_boxes"]),
        ]

    def _nonzero(self, np):
        from onnx import helper as h
        return [
            _const("th", np.float32(0.6), np.float32),
            _const("zero", [0], np.int64), _const("one", [1], np.int64),
            h.make_node("Squeeze", ["scores", "zero"], ["scores0"]),   # [C, 64]
            h.make_node("Greater", ["scores0", "th"], ["hit"]),
            h.make_node("NonZero", ["hit"], ["where"]),                 # [2, m]
            h.make_node("Transpose", ["where"], ["pairs"], perm=[1, 0]),  # [m, 2]: class, box
            h.make_node("GatherND", ["scores0", "pairs"], ["hit_scores"]),
            _const("two", [2], np.int64),
            h.make_node("Slice", ["pairs", "one", "two", "one"], ["bi2"]),
            h.make_node("Squeeze", ["bi2", "one"], ["bi"]),
            h.make_node("Squeeze", ["boxes", "zero"], ["boxes0"]),
            h.make_node("Gather", ["boxes0", "bi"], ["hit_boxes"]),
            h.make_node("Slice", ["pairs", "zero", "one", "one"], ["ci2"]),
            h.make_node("Squeeze", ["ci2", "one"], ["hit_classes"]),
        ]


def cases() -> list[DetectorCase]:
    return [DetectorCase(head, ties) for head in HEADS for ties in (False, True)] + [
        DetectorCase("nms", True, classes=3)]
