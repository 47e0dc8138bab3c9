"""Which int8 form runs fastest with IREE 3.13 on the host (issue 39, item 5): each candidate
int8 model compiled for cpu-x86_64, checked against onnxruntime on the same model, and timed side
by side (one child-free process, interleaved rounds: choose.measure) with the fp32 build, with
onnxruntime on fp32 and on the shipped int8 (QDQ, every op) model.

    nice -n 10 python bench/int8_speed.py --art ARTIFACTS [--models ppocr_cls face_landmark]
        [--rounds 200 --seconds 40] [--json OUT.json]

ARTIFACTS: a `doit static` artifacts folder (its models/<m>/static/model.onnx is quantized here;
for ppocr_cls the model's own calibration images, for another model 16 uniform random samples).
Candidates (CANDIDATES): onnxruntime's QDQ quantization as the quantize stage runs it (every op
it quantizes, per-channel weights), with the base flags and with the fp32 build's pinned config;
only Conv/MatMul/Gemm quantized (`ops`), the rest in fp32; weights only (`weights`: the fp32
graph with each weight replaced by its int8 rounding, rewrite/int8_forms.py) with the fp32
config's flags and rewrites; the rewrites applied before quantizing (`rw-ops`, `rw-all`,
`rw-gap`: + GlobalAveragePool); a control (`fp32-inits`: the fp32 graph with Constant nodes as
initializers). Results: docs/measurements/2026-12-03-int8-speed.md.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

BASE = ["--iree-hal-target-device=local", "--iree-hal-local-target-device-backends=llvm-cpu",
        "--iree-llvmcpu-target-triple=x86_64-linux-gnu", "--iree-llvmcpu-target-cpu=x86-64-v3",
        "--iree-vm-bytecode-module-strip-source-map", "--iree-llvmcpu-debug-symbols=false",
        "--iree-opt-data-tiling"]
BIN = REPO / ".venv" / "bin"
# the rewrites applied to the fp32 graph before quantizing (`rw` candidates: ppocr_cls's pinned
# set) and the op types the `gap` candidates quantize
INT8_REWRITES = ["conv_transpose_as_depth_to_space", "nearest_resize_as_expand",
                 "depthwise_conv_as_slice_chunks", "strided_conv_as_im2col"]
INT8_OPS = ["Conv", "MatMul", "Gemm", "GlobalAveragePool"]


def pinned(model: str) -> tuple[list[str], list[str]]:
    import yaml
    doc = yaml.safe_load((REPO / "models" / model / "configs" / "host.yaml").read_text())
    abi = doc["models"][model]["abis"]["cpu-x86_64"]
    return abi["flags"], abi["rewrites"]


def calibration(model: str, static) -> list[dict]:
    import numpy as np
    import yaml
    spec = yaml.safe_load((REPO / "models" / model / "model.yaml").read_text())
    inputs = [{"name": i.name, "shape": [d.dim_value for d in i.type.tensor_type.shape.dim],
               "dtype": "float32"} for i in static.graph.input]
    cal = (spec.get("variants") or {}).get("int8", {}).get("calibration")
    if cal:
        from pipeline.spec.calibration import Preprocessing, load_sample
        pre = {k: Preprocessing.from_dict({**v, "input": k})
               for k, v in spec["preprocessing"].items()}
        folder = REPO / "models" / model / cal["data"]
        return [load_sample(p, "image", inputs, pre) for p in sorted(folder.iterdir())]
    rng = np.random.default_rng(0)
    return [{i["name"]: rng.uniform(0, 1, i["shape"]).astype("float32") for i in inputs}
            for _ in range(16)]


def quantize(src: Path, dest: Path, samples: list[dict], ops: list[str] | None) -> None:
    import onnx
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_static)
    from pipeline.stages.quantize import constants_to_initializers

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(samples)

        def get_next(self):
            return next(self.it, None)
    m = onnx.load(str(src))
    constants_to_initializers(m)
    fp32 = dest.with_suffix(".fp32.onnx")
    onnx.save(m, str(fp32))
    quantize_static(str(fp32), str(dest), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                    **({"op_types_to_quantize": ops} if ops else {}))


def compile_vmfb(onnx_path: Path, flags: list[str], rewrites: list[str], out: Path) -> Path:
    from pipeline.rewrite.abi_rewrites import apply
    src = onnx_path
    if rewrites:
        src = out.with_suffix(".rw.onnx")
        apply(onnx_path, rewrites, src)
    mlir = out.with_suffix(".mlir")
    subprocess.run([str(BIN / "iree-import-onnx"), str(src), "--opset-version", "17", "-o",
                    str(mlir)], check=True)
    subprocess.run([str(BIN / "iree-compile"), str(mlir), *BASE, *flags, "-o", str(out)],
                   check=True)
    return out


def run_ort(path: Path, feeds: dict):
    import onnxruntime as ort
    s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return s.run(None, feeds)


_KEEP = []  # the IREE timers live until the process ends (dropping one early crashes at exit)


def run_iree(path: Path, feeds: dict):
    from pipeline.compilers.backends import BY_FORMAT
    import numpy as np
    timer = BY_FORMAT["iree-vmfb"].timer(path, "main", "local-task", len(os.sched_getaffinity(0)))
    _KEEP.append(timer)
    _, outs = timer([np.asarray(v) for v in feeds.values()])
    return outs


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--art", type=Path, required=True)
    ap.add_argument("--models", nargs="+", default=["ppocr_cls", "face_landmark"])
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=40.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--only", nargs="+", help="candidates to build (default: all)")
    ap.add_argument("--work", type=Path, help="a folder of an earlier run: its .vmfb files are reused")
    args = ap.parse_args()
    import numpy as np
    import onnx
    from pipeline.stages.choose import measure
    from pipeline.rewrite.int8_forms import weights_only
    results = {}
    for model in args.models:
        work = (args.work / model if args.work else Path(tempfile.mkdtemp(prefix=f"int8_{model}_")))
        work.mkdir(parents=True, exist_ok=True)
        static = args.art / "models" / model / "static" / "model.onnx"
        m = onnx.load(str(static))
        samples = calibration(model, m)
        flags, rewrites = pinned(model)
        q_all, q_ops = work / "q_all.onnx", work / "q_ops.onnx"
        quantize(static, q_all, samples, None)
        quantize(static, q_ops, samples, ["Conv", "MatMul", "Gemm"])
        rw = work / "rw.onnx"
        from pipeline.rewrite.abi_rewrites import apply
        apply(static, INT8_REWRITES, rw)
        q_rw = work / "q_rw_ops.onnx"
        quantize(rw, q_rw, samples, ["Conv", "MatMul", "Gemm"])
        q_rw_all, q_rw_gap = work / "q_rw_all.onnx", work / "q_rw_gap.onnx"
        quantize(rw, q_rw_all, samples, None)
        quantize(rw, q_rw_gap, samples, list(INT8_OPS))
        weights = work / "weights.onnx"
        wm = onnx.load(str(q_all.with_suffix(".fp32.onnx")))
        weights_only(wm, onnx.load(str(q_all)))
        onnx.save(wm, str(weights))
        # name -> (onnx model it computes, flags, rewrites)
        cands = {"fp32-pinned": (static, flags, rewrites), "fp32-base": (static, [], []),
                 "fp32-inits-pinned": (q_all.with_suffix(".fp32.onnx"), flags, rewrites),
                 "qdq-all-base": (q_all, [], []), "qdq-all-pinned": (q_all, flags, []),
                 "qdq-all-ukernels": (q_all, ["--iree-llvmcpu-enable-ukernels=all"], []),
                 "qdq-ops-base": (q_ops, [], []), "qdq-ops-pinned": (q_ops, flags, []),
                 "qdq-rw-ops": (q_rw, flags, []), "qdq-rw-ops-base": (q_rw, [], []),
                 "qdq-rw-all-base": (q_rw_all, [], []), "qdq-rw-gap-base": (q_rw_gap, [], []),
                 "weights-pinned": (weights, flags, rewrites)}
        cands = {k: v for k, v in cands.items() if not args.only or k in args.only}
        feeds = samples[0]
        plan = {"inputs": [], "window": {"warmup": 3, "rounds": args.rounds,
                                         "seconds": args.seconds}, "artifacts": []}
        for i, (k, v) in enumerate(feeds.items()):
            np.save(work / f"in{i}.npy", v)
            plan["inputs"].append(str(work / f"in{i}.npy"))
        names = [i.name for i in m.graph.input]
        plan["artifacts"] += [{"config": "ort-fp32", "format": "onnx", "path": str(static),
                               "input_names": names},
                              {"config": "ort-qdq-all", "format": "onnx", "path": str(q_all),
                               "input_names": names}]
        info = {}
        ref32 = run_ort(static, feeds)
        for name, (src, fl, rw_) in cands.items():
            try:
                vmfb = work / f"{name}.vmfb"
                if not vmfb.exists() or not vmfb.stat().st_size:
                    compile_vmfb(src, fl, rw_, vmfb)
            except subprocess.CalledProcessError as exc:
                info[name] = {"error": str(exc)}
                continue
            got = run_iree(vmfb, feeds)
            ref = run_ort(src, feeds)
            info[name] = {"size": vmfb.stat().st_size,
                          "max_abs_vs_own_ort": float(max(np.abs(a - b).max()
                                                          for a, b in zip(got, ref))),
                          "max_abs_vs_fp32": float(max(np.abs(a - b).max()
                                                       for a, b in zip(got, ref32)))}
            plan["artifacts"].append({"config": name, "format": "iree-vmfb", "path": str(vmfb),
                                      "entry": "main"})
        runs = [measure(plan) for _ in range(args.repeats)]
        for a in plan["artifacts"]:
            p50s = [next(x["p50_ms"] for x in r["artifacts"] if x["config"] == a["config"])
                    for r in runs]
            info.setdefault(a["config"], {})["p50_ms"] = statistics.median(p50s)
            info[a["config"]]["p50_spread"] = [min(p50s), max(p50s)]
        results[model] = {"threads": runs[0]["threads"], "rounds": [r["rounds"] for r in runs],
                          "candidates": info}
        base = info["fp32-pinned"]["p50_ms"]
        print(f"== {model} (threads {runs[0]['threads']}, rounds {results[model]['rounds']})")
        for k, v in info.items():
            if "p50_ms" in v:
                print(f"  {k:18s} p50 {v['p50_ms']:.3f} ms  x{v['p50_ms'] / base:.2f} of "
                      f"fp32-pinned  size {v.get('size', '-')}  err(own ort) "
                      f"{v.get('max_abs_vs_own_ort', '-')}  err(fp32) {v.get('max_abs_vs_fp32', '-')}")
            else:
                print(f"  {k}: {v}")
        sys.stdout.flush()
        if args.json:
            args.json.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
