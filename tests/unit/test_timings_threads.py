"""core/timings.meter under doit -n N: steps run in threads of one process; each step's record
must count the tools its own thread waited for, not its neighbours'."""
from __future__ import annotations

import sys
import threading

from pipeline.core import timings
from pipeline.core.timings import meter
from pipeline.core.tools import run_tool

BURN = [sys.executable, "-c", "import time\nt = time.process_time()\nwhile time.process_time() - t < {s}: pass"]


def _burn(seconds: float, out: dict, key: str, barrier: threading.Barrier) -> None:
    with meter() as measured:
        barrier.wait()
        run_tool([a.format(s=seconds) for a in BURN], log=None, what="burn")
    out[key] = measured


def test_each_thread_counts_its_own_tools():
    out, barrier = {}, threading.Barrier(2)
    threads = [threading.Thread(target=_burn, args=(s, out, k, barrier))
               for k, s in (("short", 0.2), ("long", 1.2))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    short, long = out["short"], out["long"]
    assert short.overlapped and long.overlapped
    assert 0.2 <= short.tools_cpu_s < 1.0, short   # its own child (plus Python's start), not the other's
    assert long.tools_cpu_s >= 1.2, long
    assert short.cpu_s < 1.0                       # this thread's own CPU, not the process's


def test_a_lone_meter_counts_the_whole_process():
    with meter() as measured:
        run_tool([a.format(s=0.2) for a in BURN], log=None, what="burn")
    assert not measured.overlapped and measured.tools_cpu_s >= 0.2


def test_a_step_notes_its_shader_pack_and_the_summary_lists_it(tmp_path):
    log = tmp_path / "logs" / "validate" / "gpu_a_vk.log"
    with timings.meter() as measured:
        timings.note("shader_pack", {"source": "machine", "compiled": 12,
                                     "cpu": "1 of 2 CPUs, GenuineIntel family 6, avx512f",
                                     "why": "the pack from the machine folder missed 12 kernel(s)"})
    timings.note("ignored", 1)  # no meter in this thread: nothing to note into
    timings.write(log, "validate", "gpu_a_vk", "ran", measured)
    (record,) = timings.read_all(tmp_path / "logs")
    assert record["notes"] == {"shader_pack": measured.notes["shader_pack"]}
    text = timings.summary([record])
    assert text.splitlines()[-2:] == [
        "shader packs (Mesa's cache for lavapipe):",
        "  missed          validate:gpu_a_vk (1 of 2 CPUs, GenuineIntel family 6, avx512f; 12 "
        "kernels compiled): the pack from the machine folder missed 12 kernel(s)"]
