"""Run a .vmfb with this machine's IREE Python runtime, in a child process of the pipeline.

    python -m pipeline.run.iree_run --module m.vmfb --function main --device local-task \
        --input in0.npy [--input in1.npy ...] --output out0.npy [--output out1.npy ...]

A child process, so that a crash in the artifact (SIGILL on a CPU lacking a feature) is an
error of the validate stage, not the end of the build.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from pipeline.core.tools import CANNOT_WRITE
from pipeline.run import spin
from pipeline.run.iree_load import to_host


FORMAT = "iree-vmfb"   # what this runtime loads: the manifest's `format` of IREE's artifacts


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.run.iree_run")
    parser.add_argument("--module", required=True)
    parser.add_argument("--function", required=True)
    parser.add_argument("--device", default="local-task")
    parser.add_argument("--input", action="append", default=[])
    parser.add_argument("--output", action="append", default=[])
    args = parser.parse_args(argv)
    if args.device != "vulkan":
        return _run(args)
    split: dict = {}
    with spin.Watcher() as watcher:  # IREE's Vulkan driver spins on lavapipe (spin.py)
        rc = _run(args, split)
    print(watcher.describe(), file=sys.stderr)
    if split:
        print(split_line(split, watcher.spin_cpu()), file=sys.stderr)
    return rc


SPLIT = "vulkan run split:"  # the log line bench/build_time.py reads
SECOND_CALL = "MODELYARD_VULKAN_SECOND_CALL"  # set (bench/build_time.py): call twice, time both


def split_line(split: dict, spin_cpu: float) -> str:
    """One log line: where a Vulkan run's time went. `load`: loading the module; `first call`:
    the call, in which lavapipe compiles each kernel at its first dispatch (llvmpipe makes a
    compute shader's variant when it is launched: measured, loading took 6-7 s of a 540 s cold
    validation) or reads it from its shader cache; `second call` (only with $MODELYARD_VULKAN_SECOND_CALL set): the same
    call again, kernels compiled, so the first minus the second is the compile; `spin`: CPU
    seconds of the threads the watcher demoted."""
    second = f", second call {split['second']:.2f} s" if "second" in split else ""
    return (f"{SPLIT} load {split['load']:.2f} s, first call {split['run']:.2f} s{second}, "
            f"spinning threads {spin_cpu:.2f} CPU s")


def _run(args, split: dict | None = None) -> int:
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    import iree.runtime as rt  # iree.runtime: 1.5 s, not needed by doit list

    inputs = [np.load(p, allow_pickle=False) for p in args.input]
    start = time.monotonic()
    module = rt.load_vm_flatbuffer_file(args.module, driver=args.device)
    fn = module[args.function]
    loaded = time.monotonic()
    results = fn(*inputs)
    if split is not None:
        split.update(load=loaded - start, run=time.monotonic() - loaded)
        if os.environ.get(SECOND_CALL):  # a measurement only: the first call's outputs are kept
            again = time.monotonic()
            fn(*inputs)
            split["second"] = time.monotonic() - again
    if not isinstance(results, (tuple, list)):
        results = (results,)
    if len(results) != len(args.output):
        print(f"the function returned {len(results)} results, {len(args.output)} expected",
              file=sys.stderr)
        return 3
    for path, value in zip(args.output, results):
        try:
            np.save(path, to_host(value), allow_pickle=False)
        except OSError as exc:  # not the artifact's failure: say which file, and why
            print(f"cannot write {exc.filename or path}: {exc.strerror}", file=sys.stderr)
            return CANNOT_WRITE
    return 0


if __name__ == "__main__":
    sys.exit(main())
