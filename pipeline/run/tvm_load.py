"""The app-side loader of TVM's artifacts (a Relax `.so`; the TVM backend's `app`): TVM's runtime
in this process when native; the TVM runner (tvm_run.py) on the aarch64 TVM runtime under
qemu-user when emulated. tvm_run.py itself imports nothing from the pipeline: it is copied to
boards as it is, hence this module beside it.
"""
from __future__ import annotations

from ..core.tools import aarch64_tvm, qemu_aarch64
from .loader import EMULATED_CPU, STAGE, Choice, Context, CpuLoader, EmulatedModule
from .tvm_run import RUNNER, TvmModule


class TvmLoader(CpuLoader):
    runtime, native_device = "TVM", "TVM runtime"

    def aarch64_runtime(self):
        return aarch64_tvm(required=False)

    def load(self, choice: Choice, art: dict, n_outputs: int, ctx: Context, where: dict):
        entry = art["entry"]
        if not choice.emulated:
            return TvmModule(str(choice.path), entry)   # numpy in, numpy out
        qemu_aarch64(stage=STAGE, **where)
        tv = aarch64_tvm(stage=STAGE, **where)
        argv = [str(tv.python), str(RUNNER), "--module", str(choice.path), "--entry", entry]
        return EmulatedModule(argv, n_outputs, where, lambda kind, path: [f"--{kind}", path],
                              env={"TVM_USE_RUNTIME_LIB": "1", "QEMU_CPU": EMULATED_CPU})
