"""The board-side C runtime against the Python runner, side by side on this machine's artifacts.

    python bench/c_runtime.py RELEASE MODEL [--calls 200] [--rounds 5] [--threads 2]

RELEASE is an unpacked release bundle (`doit release target=host ...`, or `doit verify ...
into=DIR`) holding runtime/x86_64. For every artifact of MODEL built for this machine's CPU
(IREE's .vmfb and TVM's .so), the same file is timed, in alternating rounds under the same
load, by
  * C: `modelyard-run RELEASE MODEL --bench CALLS --abi ABI --threads T --json` (a child
    process; every call = set inputs + modelyard_run + get outputs);
  * Python: pipeline/run/timing.py's runner of the artifact's driver (IreeCpuRunner, or
    TvmCpuRunner), loaded once in this process (every call = copy in + invoke + read back),
both with T CPU workers (IREE local-task --task_topology_group_count=T; TVM_NUM_THREADS=T with
TVM_THREAD_POOL_SPIN_COUNT=0), 3 warm-up calls per round. Prints per artifact the p50 over all
rounds' calls of each side, their ratio (C / Python; the goal is <= 1.05) and the invoke p50s.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from pipeline.run import timing, tvm_timing  # noqa: E402


def c_round(release: Path, model: str, abi: str, calls: int, threads: int, env: dict) -> dict:
    exe = release / "runtime" / platform.machine() / "bin" / "modelyard-run"
    argv = [str(exe), str(release), model, "--bench", str(calls), "--abi", abi,
            "--threads", str(threads), "--json"]
    result = subprocess.run(argv, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed ({result.returncode}): {result.stderr.strip()}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def python_round(runner, inputs: list, calls: int) -> dict:
    for _ in range(3):
        runner(inputs)
    total, invoke = [], []
    for _ in range(calls):
        phases, _ = runner(inputs)
        total.append(sum(phases.values()) / 1e6)
        invoke.append(phases["invoke"] / 1e6)
    return {"total_ms": total, "invoke_ms": invoke}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("release", type=Path)
    ap.add_argument("model")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    os.environ["TVM_NUM_THREADS"] = str(args.threads)   # read when TVM's thread pool starts
    os.environ["TVM_THREAD_POOL_SPIN_COUNT"] = "0"
    doc = json.loads((args.release / "release.json").read_text())
    entry = doc["models"][args.model]
    inputs = [np.zeros(t["shape"], t["dtype"]) for t in entry["io"]["inputs"]]
    print(f"{args.model}: {args.rounds} alternating rounds of {args.calls} calls, "
          f"{args.threads} threads, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
    print(f"{'abi':<18} {'C p50 ms':>9} {'Py p50 ms':>9} {'C/Py':>6}   {'C invoke':>8} {'Py invoke':>9}")
    for abi, art in entry["artifacts"].items():
        req = art["requires"]
        if req.get("arch") != platform.machine() or req.get("backend") == "vulkan-spirv":
            continue
        path = args.release / art["file"]
        if art["format"] == "tvm-so":
            runner = tvm_timing.TvmCpuRunner(path, art["entry"], "cpu", args.threads)
        else:
            runner = timing.IreeCpuRunner(path, art["entry"], req.get("hal_driver", "local-task"),
                                          args.threads)
        c, py = {"total_ms": [], "invoke_ms": []}, {"total_ms": [], "invoke_ms": []}
        for _ in range(args.rounds):
            for side, got in ((c, c_round(args.release, args.model, abi, args.calls, args.threads,
                                          dict(os.environ))),
                              (py, python_round(runner, inputs, args.calls))):
                for key in side:
                    side[key] += got[key]
        p50 = {name: {k: float(np.median(v)) for k, v in side.items()} for name, side in
               (("c", c), ("py", py))}
        print(f"{abi:<18} {p50['c']['total_ms']:>9.4f} {p50['py']['total_ms']:>9.4f} "
              f"{p50['c']['total_ms'] / p50['py']['total_ms']:>6.3f}   "
              f"{p50['c']['invoke_ms']:>8.4f} {p50['py']['invoke_ms']:>9.4f}")


if __name__ == "__main__":
    main()
