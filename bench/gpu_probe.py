"""The first wrong op of a Vulkan build on a real GPU, where lavapipe cannot show it.

`doit bisect` builds prefixes of a model and runs each the way validation does (lavapipe here).
Some builds are wrong only on a vendor driver, or only at a size lavapipe cannot run in time
(ppocr_det's baseline build: right at 64x96 on lavapipe, wrong at 480x640 on an NVIDIA H200).
This compares every intermediate in one run on the GPU machine instead:

  prepare (here, after `doit build`):
      python bench/gpu_probe.py prepare --model ppocr_det --target rk3588 --abi vulkan-baseline \
          [--artifacts artifacts] --out .gpu/probe
    takes the model's static ONNX model, applies the ABI's graph-rewrite workarounds, makes the
    output of every compute node a model output, and compiles it twice: for the ABI (its flags)
    and for llvm-cpu x86-64-v3, the reference (checked against onnxruntime here, on the golden
    inputs, before anything is written).

  run (on the GPU machine, iree-base-runtime installed; no compiler, no onnxruntime needed):
      python bench/gpu_probe.py run --dir .gpu/probe [--report probe.json]
    runs both on the golden inputs (Vulkan on the GPU, local-task on its CPU) and lists, in
    node order, each output's max abs / relative error and cosine; the first wrong one is the
    op to look at (its inputs are the previous probes, right by construction).

Making every node an output keeps each value in memory, which changes how IREE fuses
dispatches: a bug that needs a fusion across several ops may hide; cut the model at the node
found (`doit bisect` does that on lavapipe) to confirm.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PROBED = {"Conv", "ConvTranspose", "Resize", "Add", "Sub", "Concat", "Mul", "Div", "Sigmoid",
          "Relu", "HardSigmoid", "HardSwish", "Clip", "BatchNormalization", "MaxPool",
          "AveragePool", "GlobalAveragePool", "MatMul", "Gemm", "Softmax"}
REFERENCE = ["--iree-hal-target-device=local", "--iree-hal-local-target-device-backends=llvm-cpu",
             "--iree-llvmcpu-target-triple=x86_64-linux-gnu", "--iree-llvmcpu-target-cpu=x86-64-v3",
             "--iree-vm-bytecode-module-strip-source-map"]
WRONG = {"rel": 1e-3, "cosine": 0.9999}   # relative to the tensor's largest magnitude


def prepare(args) -> int:
    sys.path.insert(0, str(REPO))
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, shape_inference
    from pipeline.compilers.iree_compiler import compile_flags, find_compiler, import_argv
    from pipeline.graph import load_project
    from pipeline.rewrite.abi_rewrites import REWRITES
    from pipeline.compilers.backend import ENTRY
    from pipeline.core.layout import golden_files, static_model

    project = load_project(Path(args.models), Path(args.artifacts), args.target,
                           targets_dir=args.targets)
    model = next((m for m in project.models if m.name == args.model), None)
    target = project.targets[0]
    abi = next((a for a in target.abis if a.name == args.abi), None)
    if model is None or abi is None:
        raise SystemExit(f"gpu_probe: no model {args.model!r} or ABI {args.abi!r} in {args.target}")
    static = static_model(project.layout, model)
    golden = golden_files(project.layout, model)
    if not static.is_file():
        raise SystemExit(f"gpu_probe: {static} is missing: run `doit build target={args.target}` first")
    graph = onnx.load(str(static))
    cfg = abi.compile_config()
    rewrites = [r for w in cfg.get("workarounds", []) for r in w["rewrites"]]
    for name in rewrites:
        print(f"{name}: {len(REWRITES[name](graph))} node(s)")
    graph = shape_inference.infer_shapes(graph)
    info = {v.name: v for v in list(graph.graph.value_info) + list(graph.graph.output)}
    finals = [o.name for o in graph.graph.output]
    probes = []
    for k, node in enumerate(graph.graph.node):
        v = info.get(node.output[0])
        if (node.op_type in PROBED and v is not None and node.output[0] not in finals
                and v.type.tensor_type.elem_type == TensorProto.FLOAT):
            probes.append({"node": k, "name": node.name, "op": node.op_type, "output": node.output[0]})
            graph.graph.output.append(v)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    onnx.save(graph, str(out / "probe.onnx"))
    arrays = [np.load(golden[f"golden:input_{i}.npy"]) for i in range(len(model.inputs))]
    for i, a in enumerate(arrays):
        np.save(out / f"input_{i}.npy", a)
    mlir = out / "probe.mlir"
    subprocess.run(import_argv(out / "probe.onnx", mlir), check=True)
    flags = [f for w in cfg.get("workarounds", []) for f in w["flags"]] if args.with_flags else []
    gpu_flags = compile_flags({**{k: v for k, v in cfg.items() if k != "workarounds"},
                               "flags": [*cfg.get("flags", []), *flags]})
    for name, argv in (("probe_gpu.vmfb", gpu_flags), ("probe_cpu.vmfb", REFERENCE)):
        subprocess.run([find_compiler(), str(mlir), *argv, "-o", str(out / name)], check=True)
    mlir.unlink()
    # the reference must be right: the CPU build against onnxruntime, here
    from pipeline.run.iree_load import load_module, to_host
    session = ort.InferenceSession(str(out / "probe.onnx"), providers=["CPUExecutionProvider"])
    expected = session.run(None, {i.name: a for i, a in zip(session.get_inputs(), arrays)})
    entry = ENTRY
    got = [np.asarray(to_host(o)) for o in load_module(out / "probe_cpu.vmfb", "local-task", entry, {})(*arrays)]
    worst = max(float(np.abs(a - b).max() / (np.abs(a).max() or 1.0)) for a, b in zip(expected, got))
    if worst > WRONG["rel"]:
        raise SystemExit(f"gpu_probe: the CPU reference is off onnxruntime by {worst:.2e} (relative)")
    (out / "probe.json").write_text(json.dumps(
        {"model": model.name, "target": target.name, "abi": abi.name, "entry": entry,
         "rewrites": rewrites, "gpu_flags": gpu_flags, "reference_vs_onnxruntime": worst,
         "outputs": finals + [p["output"] for p in probes], "probes": probes,
         "inputs": len(arrays)}, indent=1))
    print(f"{len(probes)} probes; CPU reference within {worst:.1e} of onnxruntime; folder {out}")
    return 0


def run(args) -> int:
    root = Path(args.dir).resolve()
    sys.path.insert(0, str(REPO))
    import numpy as np
    from pipeline.run.iree_load import load_module, to_host
    meta = json.loads((root / "probe.json").read_text())
    arrays = [np.load(root / f"input_{i}.npy") for i in range(meta["inputs"])]
    results = {}
    for driver, name in (("local-task", "probe_cpu.vmfb"), ("vulkan", "probe_gpu.vmfb")):
        start = time.perf_counter()
        outs = load_module(root / name, driver, meta["entry"], {})(*arrays)
        results[driver] = [np.asarray(to_host(o), dtype=np.float64) for o in outs]
        print(f"{driver}: {len(outs)} outputs in {time.perf_counter() - start:.1f} s")
    where = {p["output"]: p for p in meta["probes"]}
    rows = []
    for i, name in enumerate(meta["outputs"]):
        a, b = results["local-task"][i], results["vulkan"][i]
        err = float(np.abs(a - b).max())
        cos = float((a * b).sum() / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-30))
        p = where.get(name, {"node": len(meta["outputs"]) + 10**6, "op": "(model output)", "name": name})
        rows.append({"node": p["node"], "op": p["op"], "name": p["name"], "shape": list(a.shape),
                     "max_abs": err, "rel": err / (float(np.abs(a).max()) or 1.0), "cosine": cos})
    rows.sort(key=lambda r: r["node"])
    wrong = [r for r in rows if r["rel"] > WRONG["rel"] or r["cosine"] < WRONG["cosine"]]
    for r in wrong[:10]:
        print(f"  node {r['node']} {r['op']} {r['name']} {r['shape']}: max abs {r['max_abs']:.3g} "
              f"(relative {r['rel']:.2g}), cosine {r['cosine']:.6f}")
    first = wrong[0] if wrong else None
    print(f"{len(wrong)} of {len(rows)} outputs wrong; first wrong: "
          + (f"node {first['node']} ({first['op']} {first['name']})" if first else "none"))
    if args.report:
        Path(args.report).write_text(json.dumps({**{k: meta[k] for k in ("model", "target", "abi", "rewrites", "gpu_flags")},
                                                 "first_wrong": first, "wrong": len(wrong), "rows": rows}, indent=1))
    return 1 if wrong else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--model", required=True)
    p.add_argument("--target", default="rk3588")
    p.add_argument("--abi", required=True)
    p.add_argument("--artifacts", default=str(REPO / "artifacts"))
    p.add_argument("--models", default=str(REPO / "models"))
    p.add_argument("--targets", default=None, help="another target registry folder")
    p.add_argument("--out", default=str(REPO / ".gpu" / "probe"))
    p.add_argument("--with-flags", action="store_true", help="add the ABI's workaround flags too")
    r = sub.add_parser("run")
    r.add_argument("--dir", default=str(REPO / ".gpu" / "probe"))
    r.add_argument("--report", default=None)
    args = parser.parse_args()
    return prepare(args) if args.cmd == "prepare" else run(args)


if __name__ == "__main__":
    sys.exit(main())
