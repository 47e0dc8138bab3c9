"""The RKNN-Toolkit2 child: build a `.rknn` for an RK3588-class NPU from a static ONNX model, run
the model it built in the toolkit's simulator on the golden inputs, export it, and say what it saw.

Run by pipeline/stages/rknn_compile.py with the Python of RKNN-Toolkit2's own virtual environment
(.tools/rknn-venv, setup.sh: its numpy/onnx/protobuf/torch pins clash with the project's). It
imports nothing from the `pipeline` package (that venv has none of its requirements): file paths
in, files and one JSON line out.

Build, simulate and export happen in ONE process because the toolkit's simulator runs only a model
built in the same process: a `.rknn` re-loaded with load_rknn() refuses init_runtime() without a
board ("RKNN model that loaded by 'load_rknn' not support inference on the simulator"). What the
simulator ran is therefore the in-process model that export_rknn() wrote; the caller records the
sha256 of the exported file, and that it is the file that ships.

    python rknn_driver.py --model static.onnx --out model.rknn --platform rk3588 \
        --precision fp16 --input input_0.npy --sim-output sim_0.npy --summary summary.json \
        [--dataset list.txt --algorithm normal]
"""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="rknn_driver.py")
    parser.add_argument("--model", required=True, help="the static ONNX model")
    parser.add_argument("--out", required=True, help="the .rknn file to write")
    parser.add_argument("--platform", required=True, help="RKNN target_platform, e.g. rk3588")
    parser.add_argument("--precision", choices=("fp16", "int8"), required=True)
    parser.add_argument("--dataset", help="int8: a text file, one calibration sample per line "
                                          "(the .npy of each input, space-separated)")
    parser.add_argument("--algorithm", default="normal", help="int8: RKNN's quantized_algorithm")
    parser.add_argument("--input", action="append", default=[], help="a golden input (.npy), in order")
    parser.add_argument("--sim-output", action="append", default=[],
                        help="where the simulator's output k goes (.npy), in order")
    parser.add_argument("--summary", required=True,
                        help="where to write what was built (JSON: toolkit version, outputs)")
    args = parser.parse_args(argv)
    if args.precision == "int8" and not args.dataset:
        print("an int8 build needs --dataset (the calibration samples)", file=sys.stderr)
        return 2

    import numpy as np  # numpy: 0.2 s, not needed by doit list
    from rknn.api import RKNN  # RKNN-Toolkit2: in its own venv only, not needed by doit list

    def step(name, ret):
        if ret != 0:  # the toolkit printed why (it writes straight to the output, which the caller logs)
            print(f"RKNN-Toolkit2 {name} failed (returned {ret}): see its messages above",
                  file=sys.stderr)
            raise SystemExit(3)

    # verbose: the toolkit prints its layer table (which op runs on the NPU, which on its CPU
    # fallback): the coverage facts of the build, parsed by the caller. It also writes
    # check*.onnx files into the working folder (the caller's private one).
    rknn = RKNN(verbose=True)
    config = {"target_platform": args.platform}
    if args.precision == "int8":
        config.update(quantized_dtype="w8a8", quantized_algorithm=args.algorithm)
    step("config", rknn.config(**config))
    step("load_onnx", rknn.load_onnx(model=args.model))
    step("build", rknn.build(do_quantization=args.precision == "int8", dataset=args.dataset))
    step("export_rknn", rknn.export_rknn(args.out))
    step("init_runtime (simulator)", rknn.init_runtime(target=None))
    feeds = [np.load(p, allow_pickle=False) for p in args.input]
    outputs = rknn.inference(inputs=feeds, data_format=["nchw" if f.ndim == 4 else None
                                                        for f in feeds])
    if outputs is None or len(outputs) != len(args.sim_output):
        print(f"the simulator returned {0 if outputs is None else len(outputs)} outputs, the model "
              f"has {len(args.sim_output)}", file=sys.stderr)
        return 4
    for path, out in zip(args.sim_output, outputs):
        np.save(path, np.ascontiguousarray(out), allow_pickle=False)
    rknn.release()
    report = {"toolkit": _toolkit_version(),
              "outputs": [{"shape": list(o.shape), "dtype": str(o.dtype)} for o in outputs]}
    with open(args.summary, "w") as f:  # a file: the toolkit's own output may follow any line
        json.dump(report, f, sort_keys=True)
    return 0


def _toolkit_version() -> str:
    return importlib.metadata.version("rknn-toolkit2")


if __name__ == "__main__":
    sys.exit(main())
