"""Timing a TVM `.so` on this machine (run/timing.py's Runner protocol): TVM's timer, apart from
the other runners so that only TVM's steps hold TVM's runtime in their code digest."""
from __future__ import annotations

import os
from pathlib import Path

from ..core.tools import distribution_version
from . import tvm_run


class TvmCpuRunner:
    """A TVM `.so` on this machine's CPU through TVM's runtime (Relax VM), loaded once.

    Per iteration: copy in = `tvm.runtime.tensor` of each input; invoke = the entry function
    (synchronous); read back = `.numpy()` of each result. TVM's thread pool gets `threads`
    workers (TVM_NUM_THREADS, read when the pool starts: one thread count per process), which
    do not spin (TVM_THREAD_POOL_SPIN_COUNT=0), like onnxruntime's and IREE's here: by default
    they spin-wait after each call, and took the CPUs from whatever ran next (the search runs
    onnxruntime right after the TVM artifact: its ppocr_det p50 was 90 ms there, 64 ms alone).
    """

    def __init__(self, so: Path, entry: str, device: str, threads: int):
        os.environ["TVM_THREAD_POOL_SPIN_COUNT"] = "0"  # read when TVM's thread pool starts
        self.module, self.threads = tvm_run.TvmModule(str(so), entry, threads=threads), threads

    def describe(self) -> dict:
        return {"kind": "tvm-cpu", "runtime": f"apache-tvm {distribution_version('apache-tvm')} "
                f"(Relax VM, Python)", "driver": "cpu", "threads": self.threads, "spin_count": 0,
                "phases": {"copy_in": "tvm.runtime.tensor(input) per input",
                           "invoke": "entry function call (synchronous)",
                           "read_back": "Tensor.numpy() per output"}}

    def __call__(self, inputs: list) -> tuple[dict, list]:
        return self.module.timed(inputs)
