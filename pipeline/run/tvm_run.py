"""Run a TVM Relax `.so` (built by the tvm_compile stage) on .npy inputs, in a child process.

    python pipeline/run/tvm_run.py --module model.so --entry main \
        --input in0.npy [--input in1.npy ...] --output out0.npy [--output out1.npy ...]

The same file runs natively (x86_64: this machine's Python and TVM) and under qemu-user (the
aarch64 Python and the aarch64 TVM wheel that setup.sh unpacks into .tools/): it imports
nothing from the pipeline package, only numpy and TVM's runtime. A child process, so that a
crash in the artifact (SIGILL on a CPU lacking a feature) is an error of the stage, not the
end of the build.

Only TVM's runtime library is loaded (TVM_USE_RUNTIME_LIB=1 is set before `import tvm`): that
is what a board needs, and it starts in ~7 s under qemu instead of ~15 s with the compiler.
The executable is driven through the Relax VM's own packed functions (vm_load_executable,
vm_initialization), which are part of the runtime.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

RUNNER = Path(__file__).resolve()  # run as a script by the validate stage (natively or under qemu)
FORMAT = "tvm-so"                  # what this runtime loads: the manifest's `format` of TVM's artifacts

CANNOT_WRITE = 73                  # core.tools.CANNOT_WRITE (this file imports nothing of pipeline)
KDL_CPU = 1
POOLED_ALLOCATOR = 2


class TvmModule:
    """A loaded Relax executable: call it with numpy arrays, get numpy arrays back.

    `timed(inputs)` also returns the phases of one call in nanoseconds (copy_in: numpy -> TVM
    tensors; invoke: the entry function; read_back: TVM tensors -> numpy), for the bench.
    """

    def __init__(self, path: str, entry: str = "main", threads: int | None = None):
        if threads:
            os.environ["TVM_NUM_THREADS"] = str(threads)  # read when TVM's thread pool starts
        import tvm  # tvm: 2.8 s, not needed by doit list
        self.tvm = tvm
        self.threads = threads
        self.lib = tvm.runtime.load_module(str(path))
        self.vm = self.lib["vm_load_executable"]()
        self.vm["vm_initialization"](KDL_CPU, 0, POOLED_ALLOCATOR)
        self.fn = self.vm[entry]
        self.device = tvm.cpu(0)

    def timed(self, inputs: list, clock=time.perf_counter_ns) -> tuple[dict, list]:
        t0 = clock()
        args = [self.tvm.runtime.tensor(a, self.device) for a in inputs]
        t1 = clock()
        result = self.fn(*args)
        t2 = clock()
        outputs = [r.numpy() for r in _flatten(result)]
        t3 = clock()
        return {"copy_in": t1 - t0, "invoke": t2 - t1, "read_back": t3 - t2}, outputs

    def __call__(self, *inputs) -> list:
        return self.timed(list(inputs))[1]


def _flatten(result) -> list:
    """The entry returns one tensor, or a tuple (tvm_ffi Array) of them for several outputs."""
    if hasattr(result, "numpy"):
        return [result]
    out = []
    for item in result:
        out.extend(_flatten(item))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python pipeline/run/tvm_run.py")
    parser.add_argument("--module", required=True)
    parser.add_argument("--entry", default="main")
    parser.add_argument("--input", action="append", default=[])
    parser.add_argument("--output", action="append", default=[])
    args = parser.parse_args(argv)
    os.environ.setdefault("TVM_USE_RUNTIME_LIB", "1")

    import numpy as np  # numpy: 0.2 s, not needed by doit list

    module = TvmModule(args.module, args.entry)
    results = module(*[np.load(p, allow_pickle=False) for p in args.input])
    if len(results) != len(args.output):
        print(f"the entry function returned {len(results)} results, {len(args.output)} expected",
              file=sys.stderr)
        return 3
    for path, value in zip(args.output, results):
        try:
            np.save(path, value, allow_pickle=False)
        except OSError as exc:  # not the artifact's failure: say which file, and why
            print(f"cannot write {exc.filename or path}: {exc.strerror}", file=sys.stderr)
            return CANNOT_WRITE
    import tvm  # tvm: 2.8 s, not needed by doit list
    print(f"ran {args.module} with TVM {tvm.__version__} ({os.uname().machine})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
