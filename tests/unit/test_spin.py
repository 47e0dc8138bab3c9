"""run/spin.py: which threads spin is read from /proc-like samples (runnable throughout, no
voluntary context switch, CPU time growing), never from their order; a demoted thread that
waits is given back."""
from __future__ import annotations

import os
import subprocess
import sys
import time

from pipeline.run import spin
from pipeline.run.spin import Sample, parse, spinning, woke

STAT = ("4242 (python:disk$0) R 1 2 3 4 5 6 7 8 9 10 {utime} {stime} 0 0 20 0 14 0 99 0 0 "
        "18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 -1 1 0 0 0 0 0")
STATUS = "Name:\tpython\nState:\tR (running)\nvoluntary_ctxt_switches:\t{v}\nnonvoluntary_ctxt_switches:\t9\n"


def test_a_sample_is_read_from_stat_and_status_text():
    s = parse(STAT.format(utime=300, stime=100), STATUS.format(v=7))
    assert s == Sample(state="R", cpu=400 / spin.HZ, voluntary=7)
    odd = STAT.format(utime=1, stime=1).replace("(python:disk$0)", "(a ) b (c)")  # ')' in the name
    assert parse(odd, STATUS.format(v=0)).state == "R"


def _trace(threads: dict, seconds: float, every: float = 0.5) -> list:
    """Samples every `every` s; threads: tid -> f(t) giving (state, cpu, voluntary) at t."""
    out, t = [], 0.0
    while t <= seconds + 1e-9:
        out.append((t, {tid: Sample(*f(t)) for tid, f in threads.items()}))
        t += every
    return out


# From face_landmark's validation on lavapipe (2 cores, loaded): the main thread waits, two
# runtime threads spin (0 voluntary switches, as much CPU as the worker), the worker runs most
# of the time but waits for its next job now and then.
SPINNER = lambda t: ("R", 0.6 * t, 0)
WORKER = lambda t: ("R" if int(t * 2) % 5 else "S", 0.6 * t, int(t))
MAIN = lambda t: ("S", 1.8, 28)
COMPILING = lambda t: ("R", 0.4 * t, 23)  # the worker compiling one big kernel: 93 s, no wait
LATE = lambda t: (("S", 0.0, 1) if t < 4 else ("R", 0.6 * (t - 4), 2))  # waits, then spins from 4 s
STARVED = lambda t: ("R", 0.1 * t, 0)  # runnable but hardly on a CPU: not shown to spin


def test_only_the_threads_that_spun_through_the_whole_window_are_picked():
    trace = _trace({10: MAIN, 11: WORKER, 12: SPINNER, 13: SPINNER, 14: STARVED}, 8)
    assert spinning(trace, window=3.0, busy=0.2) == {12, 13}
    assert spinning(trace[:6], window=3.0) == set()  # 2.5 s of history: too early to tell


def test_the_worker_compiling_without_a_wait_for_longer_than_the_window_is_left_alone():
    # it ran 93 s without a voluntary switch, but had waited for its jobs 23 times before
    trace = _trace({11: COMPILING, 12: SPINNER}, 93)
    assert spinning(trace, window=3.0) == {12}
    assert spinning(trace, window=3.0, waits=30) == {11, 12}  # what the lifetime rule prevents


def test_threads_that_start_spinning_later_are_picked_once_they_have_spun_a_window():
    trace = _trace({12: SPINNER, 15: LATE}, 10)
    late = [t for t, _ in trace if 15 in spinning([s for s in trace if s[0] <= t], 3.0)]
    assert late[0] == 7.0  # spinning from 4 s, picked after 3 s of it
    assert all(15 not in spinning([s for s in trace if s[0] <= t], 3.0) for t in (4.0, 5.0, 6.5))


def test_a_thread_that_appears_inside_the_window_is_not_judged_yet():
    trace = _trace({12: SPINNER}, 4) + [(4.5, {12: Sample("R", 2.7, 0), 16: Sample("R", 0.3, 0)})]
    assert spinning(trace, window=3.0) == {12}


def test_the_threads_that_waited_between_two_samples_are_named():
    before = {12: Sample("R", 3.0, 0), 13: Sample("R", 3.0, 1), 14: Sample("R", 1.0, 0)}
    now = {12: Sample("R", 5.0, 0), 13: Sample("S", 4.0, 2), 15: Sample("S", 0.0, 3)}  # 14 ended
    assert woke(before, now) == {13}


SPINNER_THEN_SLEEPER = """
import os, threading, time
def sleep():
    while True:
        time.sleep(0.01)
def spin():  # spins until demoted, then starts a thread (which inherits SCHED_IDLE), spins on
    while os.sched_getscheduler(0) != os.SCHED_IDLE:
        pass
    threading.Thread(target=sleep).start()
    while True:
        pass
threading.Thread(target=spin).start()
"""


def test_the_watcher_demotes_the_spinner_and_gives_back_what_inherits_it():
    # a process of its own (a Python thread beside the watcher would wait for the GIL)
    proc = subprocess.Popen([sys.executable, "-c", SPINNER_THEN_SLEEPER])
    try:
        # busy=0, waits=100: on a loaded machine the spinner may get under 5 % of a CPU, and wait
        # for the GIL beside the others (the rules themselves are tested above)
        with spin.Watcher(proc.pid, window=1.0, every=0.2, busy=0, waits=100) as watcher:
            deadline = time.monotonic() + 60
            while not watcher.restored and time.monotonic() < deadline:
                time.sleep(0.2)
        threads = sorted(int(t) for t in os.listdir(f"/proc/{proc.pid}/task"))
    finally:
        proc.kill()
        proc.wait()
    main, spinner, sleeper = threads
    assert main == proc.pid and main not in watcher.demoted  # the main thread never is
    assert spinner in watcher.demoted and sleeper not in watcher.demoted
    assert sleeper in watcher.restored, watcher.describe()
    assert watcher.describe().startswith(f"spin watcher: 1 spinning thread(s) demoted to "
                                         f"SCHED_IDLE ({spinner})")
    assert watcher.spin_cpu() > 0  # the demoted spinner's CPU time, from the last sample


def test_the_split_line_iree_run_writes_is_what_build_time_reads(tmp_path):
    from bench.build_time import split_table, vulkan_split
    from pipeline.run.iree_run import split_line

    logs = tmp_path / "logs" / "validate"
    logs.mkdir(parents=True)
    (logs / "rk3588_m_vulkan-baseline.log").write_text(
        "$ python -m pipeline.run.iree_run ...\n"
        + split_line({"load": 0.5, "run": 12.5, "second": 0.75}, 3.25) + "\n"  # lavapipe
        + split_line({"load": 1.5, "run": 0.25}, 0.0) + "\n")  # run.also, once: all execution
    (logs / "host_m_cpu-x86_64.log").write_text("$ python -m pipeline.run.iree_run ...\n")
    split = vulkan_split(tmp_path)
    # compile = first - second; execution = second (or the whole call, called once)
    assert split == {"rk3588_m_vulkan-baseline": (11.75, 1.0, 2.0, 3.25)}  # CPU runs: no line
    table = split_table({"cold": split, "warm shaders": {}})
    assert "| rk3588_m_vulkan-baseline | 11.8 / 1.0 / 2.0 / 3.2 | - |" in table
    assert "| total | 11.8 / 1.0 / 2.0 / 3.2 | 0.0 / 0.0 / 0.0 / 0.0 |" in table
