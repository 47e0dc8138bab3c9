"""Timing compiled artifacts and onnxruntime on this machine: one runner per artifact format and
device (each call returns its phases in ns and the outputs), and the statistics of the samples.
TVM's runner is run/tvm_timing.py's (kept apart so that IREE's steps do not hold TVM's runtime in
their code digest); the table of runners by key is bench/measure.py's RUNNERS.

Used by `doit bench` (pipeline/bench) and by the `choose` stage's fastest-on-host policy.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable, Protocol

from ..core.errors import PipelineError
from ..core.tools import distribution_version
from . import vulkan
from .iree_load import to_host

NOISY_CV = 0.10          # a series whose coefficient of variation is above this is flagged noisy
PHASES = ("copy_in", "invoke", "read_back")
STAGE = "bench"


def stats(samples_ns: list[int]) -> dict:
    """Distribution of one series, in milliseconds (percentiles interpolate linearly)."""
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    if not samples_ns:
        raise ValueError("no samples")
    ms = np.asarray(samples_ns, dtype=np.float64) / 1e6
    p50, p90, p99 = np.percentile(ms, [50, 90, 99])
    mean = float(ms.mean())
    std = float(ms.std(ddof=1)) if ms.size > 1 else 0.0
    cv = std / mean if mean > 0 else 0.0
    r = lambda x: round(float(x), 6)
    return {"n": int(ms.size), "min_ms": r(ms.min()), "p50_ms": r(p50), "p90_ms": r(p90),
            "p99_ms": r(p99), "max_ms": r(ms.max()), "mean_ms": r(mean), "stddev_ms": r(std),
            "cv": r(cv), "noisy": bool(cv > NOISY_CV)}


def paired_ratio_p50(a_ns: list[int], b_ns: list[int]) -> float:
    """Median of the per-iteration ratios a_i / b_i (pairs measured next to each other)."""
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    return round(float(np.median(np.asarray(a_ns, float) / np.asarray(b_ns, float))), 6)


# ----------------------------------------------------------------------------- runners
class Runner(Protocol):
    """One way to execute something on given inputs, timing the phases of one iteration.

    `__call__` returns ({phase: nanoseconds}, outputs as numpy arrays). The artifact runners
    report PHASES; the onnxruntime baseline reports only `total` (it takes numpy in and out).
    """
    threads: int

    def describe(self) -> dict: ...

    def __call__(self, inputs: list) -> tuple[dict, list]: ...


_IREE_TASK_THREADS: list[int] = []  # the local-task worker count this process's driver was made with


class IreeCpuRunner:
    """A .vmfb on this machine's CPU through the IREE Python runtime (drivers local-task/local-sync).

    The module is loaded once. Per iteration: copy in = `asdevicearray` of each input; invoke =
    the call of the entry function (synchronous: its results are ready when it returns);
    read back = `to_host()` of each result (a host copy).
    """

    def __init__(self, vmfb: Path, entry: str, device: str, threads: int,
                 clock: Callable[[], int] = time.perf_counter_ns):
        import iree.runtime as rt  # iree.runtime: 1.5 s, not needed by doit list
        self.rt, self.clock, self.driver = rt, clock, device
        self.threads = threads if device == "local-task" else 1
        if device == "local-task":
            # The task executor is made with the driver, once per process, from the global flags.
            if not _IREE_TASK_THREADS:
                rt.flags.parse_flags(f"--task_topology_group_count={self.threads}")
                _IREE_TASK_THREADS.append(self.threads)
            elif _IREE_TASK_THREADS[0] != self.threads:
                raise PipelineError(f"this process's IREE local-task driver already runs "
                                    f"{_IREE_TASK_THREADS[0]} worker threads; cannot bench with "
                                    f"{self.threads}", stage=STAGE,
                                    hint="bench different thread counts in separate doit runs")
        self._load(device, vmfb, entry)

    def _load(self, driver: str, vmfb: Path, entry: str) -> None:
        rt = self.rt
        self.device = rt.get_driver(driver).create_default_device()
        config = rt.Config(device=self.device)
        self.context = rt.SystemContext(config=config)
        self.context.add_vm_module(rt.VmModule.mmap(config.vm_instance, str(vmfb)))
        self.function = self.context.modules.module[entry]

    @staticmethod
    def read_back(result):
        return result.to_host()

    def describe(self) -> dict:
        return {"kind": "iree-cpu", "runtime": f"iree-base-runtime "
                f"{distribution_version('iree-base-runtime')} (Python)",
                "driver": self.driver, "threads": self.threads,
                "phases": {"copy_in": "iree.runtime.asdevicearray(device, input) per input",
                           "invoke": "entry function call (synchronous)",
                           "read_back": "DeviceArray.to_host() per output"}}

    def __call__(self, inputs: list) -> tuple[dict, list]:
        clock, rt = self.clock, self.rt
        t0 = clock()
        on_device = [rt.asdevicearray(self.device, a) for a in inputs]
        t1 = clock()
        results = self.function(*on_device)
        t2 = clock()
        results = results if isinstance(results, (tuple, list)) else (results,)
        outputs = [self.read_back(r) for r in results]
        t3 = clock()
        return {"copy_in": t1 - t0, "invoke": t2 - t1, "read_back": t3 - t2}, outputs


class IreeVulkanRunner(IreeCpuRunner):
    """A Vulkan .vmfb through the IREE Python runtime, on the driver it was validated on.

    Same phases as the CPU runner; read back copies through a host-visible staging buffer
    (pipeline.runtime.to_host), the workaround for iree-base-runtime 3.13's `to_host()` failure
    on Vulkan drivers. The driver is pinned with VK_DRIVER_FILES before IREE creates its instance.
    """

    def __init__(self, vmfb: Path, entry: str, driver: str, threads: int,
                 clock: Callable[[], int] = time.perf_counter_ns):
        import iree.runtime as rt  # iree.runtime: 1.5 s, not needed by doit list
        env = vulkan.driver_env(driver)
        for key in ("VK_DRIVER_FILES", "VK_ICD_FILENAMES", "XDG_RUNTIME_DIR"):
            if key in env:
                os.environ[key] = env[key]
        devices, why = vulkan.query_devices(env)
        if not devices:
            raise PipelineError(f"cannot bench on Vulkan driver {driver!r}: {why}", stage=STAGE)
        self.vk_device = devices[0].describe()
        self.rt, self.clock, self.driver, self.threads = rt, clock, "vulkan", threads
        self._load("vulkan", vmfb, entry)

    @staticmethod
    def read_back(result):
        return to_host(result)

    def describe(self) -> dict:
        return {"kind": "iree-vulkan", "runtime": f"iree-base-runtime "
                f"{distribution_version('iree-base-runtime')} (Python)",
                "driver": "vulkan", "device": self.vk_device, "threads": self.threads,
                "phases": {"copy_in": "iree.runtime.asdevicearray(device, input) per input",
                           "invoke": "entry function call (returns when the results are ready)",
                           "read_back": "staging-buffer copy per output (pipeline.runtime.to_host)"}}


class OnnxruntimeCpuRunner:
    """The baseline a user would otherwise pick: onnxruntime's CPU provider, numpy in and out.

    Same thread count as the artifact's device (intra-op), one inter-op thread, and no spinning:
    with the default spin-wait its threads would keep burning the cores after each run, while
    the interleaved artifact runs.
    """

    def __init__(self, model: Path, input_names: list[str], threads: int,
                 clock: Callable[[], int] = time.perf_counter_ns):
        import onnxruntime as ort  # onnxruntime: 0.2 s, not needed by doit list
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        opts.log_severity_level = 3
        self.session = ort.InferenceSession(str(model), sess_options=opts,
                                            providers=["CPUExecutionProvider"])
        self.names, self.threads, self.clock = input_names, threads, clock

    def describe(self) -> dict:
        return {"kind": "onnxruntime-cpu", "runtime": f"onnxruntime "
                f"{distribution_version('onnxruntime')}", "provider": "CPUExecutionProvider",
                "threads": self.threads, "inter_op_threads": 1, "allow_spinning": False,
                "graph_optimization": "ORT_ENABLE_ALL (default)"}

    def __call__(self, inputs: list) -> tuple[dict, list]:
        feeds = dict(zip(self.names, inputs))
        t0 = self.clock()
        outputs = self.session.run(None, feeds)
        return {"total": self.clock() - t0}, outputs
