"""core/steps._Gate: doit -n N runs steps side by side in threads; a step part that asks to run
alone (lavapipe's kernel compiles) waits for the steps beside it and keeps new ones out."""
from __future__ import annotations

import threading
import time

from pipeline.core.steps import _Gate


def test_alone_waits_for_running_steps_and_keeps_new_ones_out():
    gate, events = _Gate(), []
    started = threading.Event()

    def neighbour():  # a step already running when the other asks to run alone
        with gate.shared():
            started.set()
            time.sleep(0.3)
            events.append("neighbour done")

    def lonely():
        with gate.shared():
            started.wait()
            with gate.alone():
                events.append("alone start")
                time.sleep(0.3)
                events.append("alone end")

    def late():  # a step that starts while the lonely part waits to run alone
        while not gate._waiting and "alone start" not in events:
            time.sleep(0.01)
        with gate.shared():
            events.append("late start")

    threads = [threading.Thread(target=f) for f in (neighbour, lonely, late)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert events == ["neighbour done", "alone start", "alone end", "late start"]


def test_two_steps_asking_to_run_alone_take_turns():
    gate, inside, most = _Gate(), [0], [0]
    lock = threading.Lock()

    def step():
        with gate.shared(), gate.alone():
            with lock:
                inside[0] += 1
                most[0] = max(most[0], inside[0])
            time.sleep(0.1)
            with lock:
                inside[0] -= 1

    threads = [threading.Thread(target=step) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert not any(t.is_alive() for t in threads) and most[0] == 1
