"""Both compilers side by side for one model on this machine: untuned TVM, tuned TVM, IREE, onnxruntime.

    python bench/compilers.py --model ppocr_cls [--artifacts artifacts] [--rounds 50] [--seconds 60]

Reads artifacts/host/manifest.json (run `doit build target=host` first). The IREE `.vmfb` and
the TVM `.so` are the host target's artifacts; when the TVM one was built with a tuning
database, an untuned build of the same static model and target is compiled into a temporary
folder for comparison (and vice versa: without a database there is no tuned row, and the
table says why). All runners are loaded once and timed in interleaved rounds (the first runner
of each round rotates, so a burst of load from another process hits all of them), on the
golden inputs, with the same thread count; the last outputs of each are checked against golden.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def _untuned(art: dict, static: Path, out: Path) -> Path:
    from pipeline.stages.tvm_compile import compile_argv
    config = {"target": art["compile"]["target"], "linker": art["compile"]["linker"],
              "entry": art["entry"]}
    proc = subprocess.run(compile_argv(static, config, out, None), capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    if proc.returncode != 0:
        raise SystemExit(f"compilers: the untuned TVM compile failed:\n{proc.stdout[-2000:]}")
    return out


def main(argv=None) -> int:
    import numpy as np
    from pipeline.run.timing import IreeCpuRunner, OnnxruntimeCpuRunner, stats
    from pipeline.run.tvm_timing import TvmCpuRunner
    from pipeline.core.numerics import compare, summary

    parser = argparse.ArgumentParser(prog="python bench/compilers.py")
    parser.add_argument("--model", required=True)
    parser.add_argument("--artifacts", default=str(REPO / "artifacts"))
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)

    root = Path(args.artifacts)
    manifest = json.loads((root / "host" / "manifest.json").read_text())
    if args.model not in manifest["models"]:
        raise SystemExit(f"compilers: no model {args.model!r} in the host manifest "
                         f"(it has: {', '.join(manifest['models'])})")
    entry = manifest["models"][args.model]
    arts = entry["artifacts"]
    iree = next((a for a in arts.values() if a["format"] == "iree-vmfb"
                 and a["abi"].get("backend") == "llvm-cpu"), None)
    tvm = next((a for a in arts.values() if a["format"] == "tvm-so"), None)
    static = root / "models" / args.model / "static" / "model.onnx"
    golden_dir = root / "models" / args.model / "golden"
    doc = json.loads((golden_dir / "golden.json").read_text())
    inputs = [np.load(golden_dir / e["file"]) for e in doc["inputs"]]
    expected = [np.load(golden_dir / e["file"]) for e in doc["outputs"]]

    runners, missing = {}, {}
    with tempfile.TemporaryDirectory(prefix="modelyard-compilers-") as tmp:
        if tvm is None:
            missing["TVM untuned"] = missing["TVM tuned"] = "no TVM artifact in the manifest"
        else:
            so = root / tvm["path"]
            if tvm.get("tuning"):
                t = tvm["tuning"]
                tuned_label = (f"TVM tuned ({t['trials_spent']} trials, budget {t['trials_budget']}, "
                               f"{t['source']})")
                started = time.perf_counter()
                untuned = _untuned(tvm, static, Path(tmp) / "untuned.so")
                print(f"compiled the untuned TVM build in {time.perf_counter() - started:.1f} s")
                runners["TVM untuned"] = TvmCpuRunner(untuned, tvm["entry"], "cpu", args.threads)
                runners[tuned_label] = TvmCpuRunner(so, tvm["entry"], "cpu", args.threads)
            else:
                runners["TVM untuned"] = TvmCpuRunner(so, tvm["entry"], "cpu", args.threads)
                missing["TVM tuned"] = (f"no tuning budget for {args.model} on host "
                                        f"(tvm.tune.host in its model.yaml)")
        if iree is None:
            missing["IREE"] = "no IREE CPU artifact in the manifest"
        else:
            runners["IREE"] = IreeCpuRunner(root / iree["path"], iree["entry"], "local-task",
                                            args.threads)
        ort = OnnxruntimeCpuRunner(static, [e["name"] for e in doc["inputs"]], args.threads)
        runners["onnxruntime"] = lambda xs: ort(xs)

        names = list(runners)
        for _ in range(args.warmup):
            for name in names:
                runners[name](inputs)
        samples = {n: [] for n in names}
        outputs = {}
        start, rounds = time.perf_counter(), 0
        while rounds < args.rounds and time.perf_counter() - start < args.seconds:
            k = rounds % len(names)
            for name in names[k:] + names[:k]:
                phases, outputs[name] = runners[name](inputs)
                samples[name].append(sum(phases.values()))
            rounds += 1

    out_names = [o["name"] for o in doc["outputs"]]
    tol = tvm["validation"]["tolerance"] if tvm else iree["validation"]["tolerance"]
    rows = []
    ort_p50 = stats(samples["onnxruntime"])["p50_ms"]
    for name in names:
        s = stats(samples[name])
        check = compare([np.asarray(o) for o in outputs[name]], expected, out_names, tol)
        rows.append({"runner": name, **{k: s[k] for k in ("n", "min_ms", "p50_ms", "p90_ms", "cv")},
                     "ratio_to_onnxruntime": round(s["p50_ms"] / ort_p50, 3),
                     "matches_golden": check["passed"], "errors": summary(check)})
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                if l.startswith("model name")), "unknown")
    print(f"{args.model} on {cpu}, {args.threads} thread(s), {rounds} interleaved rounds "
          f"({time.perf_counter() - start:.2f} s), load average {os.getloadavg()[0]:.2f}")
    width = max(len(r["runner"]) for r in rows)
    print(f"{'runner'.ljust(width)}  {'p50 ms':>9}  {'p90 ms':>9}  {'min ms':>9}  {'cv':>5}  "
          f"{'x ORT':>7}  golden")
    for r in rows:
        print(f"{r['runner'].ljust(width)}  {r['p50_ms']:9.3f}  {r['p90_ms']:9.3f}  "
              f"{r['min_ms']:9.3f}  {r['cv']:5.2f}  {r['ratio_to_onnxruntime']:7.2f}  "
              f"{'ok' if r['matches_golden'] else 'DIFFERS: ' + r['errors']}")
    for name, why in missing.items():
        print(f"{name}: not measured: {why}")
    if args.json:
        Path(args.json).write_text(json.dumps({"model": args.model, "cpu": cpu,
                                               "threads": args.threads, "rounds": rounds,
                                               "rows": rows, "missing": missing}, indent=2) + "\n")
    return 0 if all(r["matches_golden"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
