"""The tuning budget's arithmetic against a shared database (pipeline/compilers/tuning_db.py), the
progress line's estimate, the tuning curve's checkpoints and interleaving: pure, no TVM."""
from __future__ import annotations

import pytest

from pipeline.bench.tuning_curve import Options, checkpoints, interleaved
from pipeline.core.errors import PipelineError
from pipeline.compilers.tuning_db import exhausted_after, plan
from pipeline.compilers.tvm_tune_progress import Progress, duration
from pipeline.compilers.tvm_tuning import search_population
from pipeline.graph.tune_command import pin_mode


def test_a_fresh_database_leaves_the_whole_budget():
    p = plan([0, 0, 0], [False] * 3, trials=6, per_task=2)
    assert (p.already, p.remaining, p.need, p.covered) == (0, 6, (2, 2, 2), False)
    assert p.batches() == [(2, [0, 1, 2])]
    assert p.describe() == "0 of 6 trials already measured (0 of 3 tasks need no more)"


def test_resuming_counts_what_is_there_and_tunes_only_the_rest():
    # killed midway: task 0 done, task 1 half done (a batch cut short), task 2 untouched
    p = plan([2, 1, 0], [False] * 3, trials=6, per_task=2)
    assert (p.already, p.remaining, p.need) == (3, 3, (0, 1, 2))
    assert p.batches() == [(2, [2]), (1, [1])]   # one per-task cap per MetaSchedule run
    assert p.describe() == "3 of 6 trials already measured (1 of 3 tasks need no more)"


def test_records_beyond_the_per_task_cap_do_not_count_for_other_tasks():
    # a kernel another model tuned with 8 trials counts as 2 for a per_task=2 budget
    p = plan([8, 0], [False, False], trials=4, per_task=2)
    assert (p.already, p.remaining, p.need) == (2, 2, (0, 2))


def test_a_budget_below_per_task_times_tasks_is_covered_once_spent():
    p = plan([2, 2, 0, 0], [False] * 4, trials=4, per_task=2)
    assert (p.already, p.remaining, p.covered) == (4, 0, True)
    p = plan([2, 1, 0, 0], [False] * 4, trials=4, per_task=2)
    assert (p.already, p.remaining) == (3, 1)


def test_a_task_whose_search_space_ran_dry_needs_nothing_more():
    # ppocr_cls's pinned database: 107 of 108 trials, one task had a single candidate
    have = [2] * 53 + [1]
    assert plan(have, [False] * 54, 108, 2).remaining == 1
    done = plan(have, [False] * 53 + [True], 108, 2)
    assert (done.already, done.remaining, done.covered) == (107, 0, True)


def test_plan_refuses_lists_of_different_tasks():
    with pytest.raises(ValueError):
        plan([1, 2], [False], 4, 2)


def test_only_a_run_that_ended_with_budget_left_proves_a_task_dry():
    caps, have = {0: 2, 1: 2, 2: 2}, {0: 2, 1: 1, 2: 0}
    assert exhausted_after(run_budget=6, spent=3, caps=caps, have=have) == [1, 2]
    assert exhausted_after(run_budget=3, spent=3, caps=caps, have=have) == []


def test_progress_line_counts_the_database_and_estimates_from_this_runs_rate():
    now = [100.0]
    progress = Progress(["conv", "matmul"], [2, 0], trials=6, already=2, planned=4,
                        emulated=False, clock=lambda: now[0])
    progress.members = [1, 0]        # the group's task 0 is the model's task 1
    now[0] = 130.0
    line = progress.batch(0, [20e-6, 12.5e-6], failed=0)
    assert line == ("[tune] task 2/2 matmul: 2 trials, best 12.5 us | 4/6 trials, 30 s, about "
                    "30 s left")
    now[0] = 190.0
    line = progress.batch(1, [], failed=2)
    assert line == ("[tune] task 1/2 conv: 4 trials, no valid run yet, 2 failed | 6/6 trials, "
                    "90 s, about 0 s left")
    assert [duration(s) for s in (59.4, 61, 3725)] == ["59 s", "1 min 01 s", "1 h 02 min"]
    assert [search_population(p) for p in (1, 2, 8, 64)] == [64, 64, 256, 512]


def test_pin_modes():
    assert [pin_mode(v) for v in ("0", "1", "yes", "shared", "model", None)] == \
        [None, "shared", "shared", "shared", "model", None]
    with pytest.raises(PipelineError) as err:
        pin_mode("maybe")
    assert "pin=maybe is not a pin mode" in err.value.render()


def test_curve_checkpoints_are_prefixes_of_the_measured_records():
    assert checkpoints(64, (0, 25, 50, 100)) == [(0, 0), (25, 16), (50, 32), (100, 64)]
    assert checkpoints(2, (0, 25, 50, 100)) == [(0, 0), (50, 1), (100, 2)]  # 25 % rounds to 0
    assert Options.from_vars({"points": "100,0,50"}).points == (0, 50, 100)
    with pytest.raises(PipelineError):
        Options.from_vars({"points": "0,150"})


def test_curve_rounds_rotate_the_order_and_stop_on_the_time_budget():
    calls, clock = [], iter(range(0, 10**6, 10))
    runners = [lambda x, n=n: (calls.append(n), ({}, [n]))[1] for n in "abc"]
    m = interleaved(runners, [], rounds=3, seconds=0, warmup=0, clock=lambda: next(clock))
    assert "".join(calls) == "abcbcacab" and m["rounds"] == 3 and m["ended_by"] == "rounds"
    assert [len(s) for s in m["samples_ns"]] == [3, 3, 3] and m["outputs"] == [["a"], ["b"], ["c"]]
    calls.clear()
    slow = iter(range(0, 10**12, 10**9))  # each clock read: one more second
    m = interleaved(runners, [], rounds=100, seconds=5, warmup=1, clock=lambda: next(slow))
    assert m["ended_by"] == "seconds" and 0 < m["rounds"] < 100 and calls[:3] == ["a", "b", "c"]
