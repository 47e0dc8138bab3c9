"""Run modelyard's Vulkan artifacts on a real GPU through its vendor Vulkan driver.

Two halves, because the GPU machine has no IREE compiler and no repo build:

  prepare (here, after `doit build`):
      python bench/vulkan_gpu.py prepare --out .gpu [--artifacts artifacts] [--gpu-target ampere]
    For every model with a static model and golden outputs under artifacts/models: compiles the
    target's Vulkan ABIs from it with the target's flags (saying whether the bytes equal the
    shipped artifact in the manifest), plus a twin for the GPU's own IREE target (`ampere` for
    NVIDIA Ampere and later), and copies the golden inputs/outputs and tolerances.

  run (on the GPU machine, with iree-base-runtime installed):
      python bench/vulkan_gpu.py run --dir .gpu [--iterations 200]
    Lists the Vulkan device, and for each artifact checks its recorded requirements against the
    device (pipeline.vulkan.meets: never runs what would compute wrong numbers), runs it, compares
    with golden (max abs, cosine) and times p50/p90 over the iterations (invoke + readback).

The prepared folder carries a copy of the `pipeline` package (the runner needs pipeline.run.iree_load,
pipeline.run.vulkan and pipeline.core.numerics; nothing of it imports a compiler). An ABI's
workarounds apply as in the build: its flags through compile_flags, its graph rewrites
(pipeline/rewrite/abi_rewrites.py) on the static model before import.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _compile(find_tool, compile_flags, requirements, mlir: Path, cfg: dict, vmfb: Path) -> dict | None:
    """Compile as the iree_compile stage does: the ABI's flags, then each declared fallback
    (pipeline.compilers.iree_compiler.attempts); None when every attempt fails."""
    from pipeline.compilers.iree_compiler import attempts
    for attempt in attempts(cfg):
        config = {k: v for k, v in cfg.items() if k != "workarounds"}
        argv = [find_tool("iree-compile"), mlir.name, *compile_flags({**config, "flags": attempt["flags"]})]
        if subprocess.run(argv + ["-o", str(vmfb)], cwd=mlir.parent).returncode == 0:  # relative,
            break                                                                       # as the pipeline
    else:
        return None
    sources = vmfb.with_suffix(".executables.mlir")
    subprocess.run(argv + ["--compile-to=executable-sources", "-o", str(sources)], check=True,
                   cwd=mlir.parent)
    req = requirements(sources.read_text())
    sources.unlink()
    return req


def prepare(args) -> int:
    sys.path.insert(0, str(REPO))
    from iree.compiler.tools.binaries import find_tool
    from pipeline.compilers.iree_compiler import compile_flags
    from pipeline.compilers.iree_targets import requirements
    from pipeline.spec import load_target
    from pipeline.core.store import sha256_file
    from pipeline.rewrite.abi_rewrites import apply as apply_rewrites

    artifacts = Path(args.artifacts).resolve()
    target = load_target(args.target)
    manifest_path = artifacts / args.target / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {"models": {}}
    out = Path(args.out).resolve()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    shutil.copytree(REPO / "pipeline", out / "pipeline", ignore=shutil.ignore_patterns("__pycache__"))
    cases = []
    for static in sorted((artifacts / "models").glob(f"{args.models}/static/model.onnx")):
        model = static.parent.parent.name
        dest = out / model
        shutil.copytree(static.parent.parent / "golden", dest / "golden")
        tolerance = json.loads((static.parent / "step.json").read_text())["key_parts"]["config"]["tolerance"]
        mlir = dest / "model.mlir"
        subprocess.run([sys.executable, "-m", "iree.compiler.tools.import_onnx", str(static),
                        "-o", str(mlir)], check=True)

        def imported(cfg: dict) -> Path:
            """The MLIR this ABI compiles: the static model's, or that of its rewritten copy."""
            rewrites = [r for w in cfg.get("workarounds") or () for r in w["rewrites"]]
            if not rewrites:
                return mlir
            folder = dest / ("rw-" + "-".join(rewrites))
            folder.mkdir(exist_ok=True)
            if not (folder / "model.mlir").is_file():
                apply_rewrites(static, rewrites, folder / "model.onnx")
                subprocess.run([sys.executable, "-m", "iree.compiler.tools.import_onnx",
                                str(folder / "model.onnx"), "-o", str(folder / "model.mlir")], check=True)
            return folder / "model.mlir"
        shipped = manifest["models"].get(model, {}).get("artifacts", {})
        builds = [(abi.name, abi.compile_config(), "the target's ABI") for abi in target.abis
                  if abi.backend == "vulkan-spirv"]
        builds.append((f"twin-{args.gpu_target}", {"backend": "vulkan-spirv", "vulkan_target":
                       args.gpu_target, "vulkan_features": None, "flags": []},
                       f"twin of the same static model for {args.gpu_target}"))
        for name, cfg, kind in builds:
            vmfb = dest / f"{name}.vmfb"
            start = time.perf_counter()
            req = _compile(find_tool, compile_flags, requirements, imported(cfg), cfg, vmfb)
            if req is None:
                print(f"{model}: {vmfb.name} ({kind}): iree-compile failed with every attempt")
                continue
            digest = sha256_file(vmfb)
            if name in shipped:
                kind += (", byte-identical to the shipped artifact" if shipped[name]["sha256"] == digest
                         else ", DIFFERS from the shipped artifact")
            print(f"{model}: {vmfb.name} ({kind}) compiled in {time.perf_counter() - start:.1f} s")
            cases.append({"model": model, "artifact": vmfb.name, "kind": kind, "sha256": digest,
                          "requires": req, "tolerance": tolerance})
        for f in dest.rglob("model.mlir"):
            f.unlink()
        for folder in dest.glob("rw-*"):  # the rewritten models: only their artifacts travel
            shutil.rmtree(folder)
    (out / "cases.json").write_text(json.dumps(cases, indent=2, sort_keys=True) + "\n")
    print(f"prepared {len(cases)} artifacts in {out}")
    return 0


def run(args) -> int:
    root = Path(args.dir).resolve()
    sys.path.insert(0, str(root))
    import numpy as np
    from pipeline.run import vulkan
    from pipeline.core.numerics import compare, summary
    from pipeline.run.iree_load import load_module, to_host

    env = vulkan.driver_env(None)
    devices, why = vulkan.query_devices(env)
    if not devices:
        print(f"no Vulkan device: {why}")
        return 2
    device = devices[0]
    print(f"device: {device.describe()}; subgroup {device.min_subgroup_size}..{device.max_subgroup_size}")
    results = []
    for case in json.loads((root / "cases.json").read_text()):
        label = f"{case['model']}/{case['artifact']} ({case['kind']})"
        problems = vulkan.meets(case["requires"], device)
        if problems:
            print(f"SKIP {label}: {'; '.join(problems)}")
            results.append({**case, "status": "not run", "why": problems})
            continue
        gdir = root / case["model"] / "golden"
        doc = json.loads((gdir / "golden.json").read_text())
        ins = [np.load(gdir / e["file"]) for e in doc["inputs"]]
        expected = [np.load(gdir / e["file"]) for e in doc["outputs"]]
        start = time.perf_counter()
        fn = load_module(root / case["model"] / case["artifact"], "vulkan", "main", {})
        load_s = time.perf_counter() - start
        samples, outs = [], None
        for i in range(args.iterations + 1):
            t0 = time.perf_counter()
            res = fn(*ins)
            res = res if isinstance(res, (tuple, list)) else (res,)
            outs = [to_host(r) for r in res]
            if i:  # the first call builds pipelines: not a steady-state sample
                samples.append(time.perf_counter() - t0)
        check = compare(outs, expected, [e["name"] for e in doc["outputs"]], case["tolerance"])
        p50, p90 = (float(np.percentile(samples, q)) * 1e3 for q in (50, 90))
        print(f"{'PASS' if check['passed'] else 'FAIL'} {label}: {summary(check)}; "
              f"load {load_s:.2f} s, p50 {p50:.3f} ms, p90 {p90:.3f} ms over {len(samples)} runs")
        results.append({**case, "status": "passed" if check["passed"] else "failed",
                        "outputs": check["outputs"], "load_s": load_s, "p50_ms": p50,
                        "p90_ms": p90, "iterations": len(samples)})
    report = {"device": device.describe(), "results": results}
    text = json.dumps(report, indent=2, sort_keys=True) + "\n"
    if args.report:
        Path(args.report).write_text(text)
    return 0 if all(r["status"] != "failed" for r in results) else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--out", default=".gpu")
    p.add_argument("--artifacts", default=str(REPO / "artifacts"))
    p.add_argument("--target", default="rk3588")
    p.add_argument("--gpu-target", default="ampere")
    p.add_argument("--models", default="*", help="glob over model names")
    r = sub.add_parser("run")
    r.add_argument("--dir", default=".gpu")
    r.add_argument("--iterations", type=int, default=200)
    r.add_argument("--report")
    args = parser.parse_args()
    return prepare(args) if args.cmd == "prepare" else run(args)


if __name__ == "__main__":
    sys.exit(main())
